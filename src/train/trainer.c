/* The training loop: setup (everything that can fail is checked before anything is written),
 * then per optimizer step: grad_accum micro-batches of forward + backward, gradient norm,
 * AdamW with clipping on the warmup + cosine schedule, the FP8 scale update, validation,
 * metrics, detectors (NaN, spike, drift, shadow BF16) and checkpoints. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "fp8train/checkpoint.h"
#include "fp8train/dist.h"
#include "fp8train/export.h" /* fp8t_weights_load (--init) */
#include "fp8train/error.h"
#include "fp8train/inject.h"
#include "fp8train/io.h"
#include "fp8train/policy_json.h"
#include "fp8train/train_options.h"
#include "train/trainer_internal.h"

#define MAX_ROLLBACKS 10

double trainer_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Non-finite values among n floats: a checkpoint that holds any is never "good" (a NaN stop
 * must not send the user back to it, nor a rollback load it). */
static size_t count_nonfinite(const float *x, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += !isfinite(x[i]);
    return bad;
}

/* ---------------------------------------------------------------- the model hook */

/* The one hook: fault injection first (it may change the tensor the others then see), NaN
 * provenance, then statistics. */
static void trainer_hook(void *ctx, fp8t_model *m, const fp8t_tensor_site *site, float *x) {
    trainer *t = ctx;
    if (t->injector) fp8t_injector_observe(t->injector, m, site, x);
    if (t->track_nan) fp8t_nan_tracker_observe(t->nan, m, site, x);
    if (t->inspector && t->hook_inspect) fp8t_inspector_observe(t->inspector, m, site, x);
}

/* Install the hook only while something listens: a hooked model takes slower, unfused paths
 * (so the inspector's hook is on for its selected steps only). */
static void update_hook(trainer *t) {
    int on = t->injector ||
             (t->inspector && t->hook_inspect && fp8t_inspector_active(t->inspector)) ||
             t->track_nan;
    /* without the injector the hook only reads: the model keeps its FP8 save of X and its dY
     * code reuse (no FP32 copy of X per layer while inspecting) */
    const int reads = !t->injector && (!t->inspector || fp8t_inspector_reads_only(t->inspector));
    if (on && reads)
        fp8t_model_set_observer(t->model, trainer_hook, t);
    else
        fp8t_model_set_hook(t->model, on ? trainer_hook : NULL, t);
}

/* ---------------------------------------------------------------- frozen forwards */

/* Validation and the shadow BF16 loss run on the trained model itself, frozen: no amax reaches
 * the FP8 recipe state and the step's bookkeeping stays as it was (fp8t_model_set_frozen), so
 * the training trajectory is bit-identical with or without them. The hook is off meanwhile:
 * the injector, the NaN tracker and the inspector observe training GEMMs only (a fault fired or
 * a statistic taken here would change the run or its record). */
static void freeze(trainer *t) {
    fp8t_model_set_hook(t->model, NULL, NULL);
    fp8t_model_set_frozen(t->model, 1);
}

static void unfreeze(trainer *t) {
    fp8t_model_set_frozen(t->model, 0);
    update_hook(t);
}

/* Mean loss over the fixed validation micro-batches 0..val_batches-1, between steps (the
 * host token buffers are free then), in the precision the model currently runs. */
static float validate(trainer *t) {
    double sum = 0;
    freeze(t);
    if (t->dp.size > 1) {
        /* data parallel: rank r takes batches r, r + N, ...; the losses are gathered and summed
         * in batch order, as one process sums them */
        float *l = calloc((size_t)t->cfg.val_batches, sizeof(float));
        if (!l) fp8t_dist_abort(1);
        for (int j = t->dp.rank; j < t->cfg.val_batches; j += t->dp.size) {
            fp8t_data_batch(t->val, t->tokens, t->targets, (uint64_t)j);
            l[j] = fp8t_model_forward(t->model, t->tokens, t->targets);
        }
        fp8t_dist_allreduce_f32(l, (size_t)t->cfg.val_batches, FP8T_RED_SUM); /* x + 0 = x */
        for (int j = 0; j < t->cfg.val_batches; j++) sum += l[j];
        free(l);
    } else {
        for (int j = 0; j < t->cfg.val_batches; j++) {
            fp8t_data_batch(t->val, t->tokens, t->targets, (uint64_t)j);
            sum += fp8t_model_forward(t->model, t->tokens, t->targets);
        }
    }
    unfreeze(t);
    return (float)(sum / t->cfg.val_batches);
}

/* The loss of the batch in t->tokens with every GEMM in BF16 and the same weights: a frozen
 * forward under the all-BF16 policy, before the step's own forward of that batch (so its
 * backward sees its own activations). The policy comes back as it was, with no change to the
 * FP8 state even if the two differ in the dY format. */
static float shadow_forward(trainer *t) {
    const fp8t_policy keep = *fp8t_model_get_policy(t->model);
    freeze(t);
    fp8t_model_set_policy(t->model, &t->bf16_policy);
    float loss = fp8t_model_forward(t->model, t->tokens, t->targets);
    fp8t_model_set_policy(t->model, &keep);
    unfreeze(t);
    return loss;
}

/* ---------------------------------------------------------------- checkpoints */

static int save_checkpoint(trainer *t, int step, float loss, char *err, size_t errlen) {
    fp8t_checkpoint ck;
    memset(&ck, 0, sizeof(ck));
    const fp8t_backend_ops *ops = t->be->ops;
    ck.step = step;
    ck.data_position = fp8t_data_position(t->train);
    ck.seed = t->cfg.seed;
    ck.loss = loss;
    ck.model = t->cfg.model;
    ck.num_params = fp8t_model_num_params(t->model);
    ck.fp8_n = fp8t_model_fp8_count(t->model);
    ck.fp8_len = fp8t_model_fp8_history_len(t->model);
    size_t nst = fp8t_recipe_state_floats(ck.fp8_n, ck.fp8_len);
    size_t pbytes = ck.num_params * sizeof(float);
    /* the moments this rank holds: all of them, or under ZeRO-1 its shard, which it writes
     * to a file of its own (no gather) */
    dp_moment_range(&t->dp, ck.num_params, &ck.adam_lo, &ck.adam_hi);
    ck.shards = t->dp.zero ? t->dp.size : 0;
    ck.params = malloc(pbytes);
    ck.adam_m = malloc((ck.adam_hi - ck.adam_lo) * sizeof(float) + 1);
    ck.adam_v = malloc((ck.adam_hi - ck.adam_lo) * sizeof(float) + 1);
    ck.fp8_state = malloc(nst * sizeof(float));
    int rc = -1, trc = 0;
    char dir[FP8T_TRAIN_PATH_BUF] = "", tmp[FP8T_TRAIN_PATH_BUF * 2] = "";
    if (!ck.params || !ck.adam_m || !ck.adam_v || !ck.fp8_state) {
        fp8t_errorf(err, errlen, "out of memory writing a checkpoint");
        trc = -1;
    }
    /* every rank goes the same way through the collectives below */
    if (dp_agree(&t->dp, trc, err, errlen) != 0) goto out;
    ops->to_host(t->be, ck.params, fp8t_model_params(t->model), pbytes);
    dp_adam_to_host(&t->dp, t->be, t->model, ck.adam_m, ck.adam_v);
    ops->to_host(t->be, ck.fp8_state, fp8t_model_fp8_state(t->model), nst * sizeof(float));
    ck.config_json = fp8t_train_config_to_json(&t->cfg);
    ck.policy_json = fp8t_policy_to_json(&t->run_policy);
    fp8t_checkpoint_dir(dir, sizeof(dir), t->cfg.out_dir, step);
    /* ZeRO-1: every rank writes its optimizer shard into rank 0's temporary directory, and
     * rank 0 completes it once all have (checkpoint.h: the sharded save) */
    if (ck.shards) {
        if (t->dp.rank == 0) trc = fp8t_checkpoint_begin(dir, tmp, sizeof(tmp), err, errlen);
        if (dp_agree(&t->dp, trc, err, errlen) != 0) goto out;
        if (t->dp.size > 1) fp8t_dist_bcast(tmp, sizeof(tmp), 0);
        trc = fp8t_checkpoint_write_shard(tmp, &ck, t->dp.rank, t->dp.size, err, errlen);
        if (dp_agree(&t->dp, trc, err, errlen) != 0) {
            if (t->dp.rank == 0) fp8t_checkpoint_abandon(tmp);
            goto out;
        }
    }
    /* the replicated state (weights, FP8 state, plain moments): rank 0 writes it */
    if (t->dp.rank == 0) {
        if ((ck.shards ? fp8t_checkpoint_commit(tmp, dir, &ck, err, errlen)
                       : fp8t_checkpoint_save(dir, &ck, err, errlen)) != 0) {
            /* err names the file that failed (a temporary): say which checkpoint, and what is
             * safe */
            char e[FP8T_TRAIN_PATH_BUF];
            snprintf(e, sizeof(e), "%s", err);
            fp8t_errorf(err, errlen,
                        "checkpoint %s not written: %s; training stopped at step %d%s%s", dir, e,
                        step, t->last_ckpt[0] ? " (the last complete checkpoint is " : "",
                        t->last_ckpt[0] ? t->last_ckpt : "");
            if (t->last_ckpt[0]) {
                size_t n = strlen(err);
                if (n + 1 < errlen) snprintf(err + n, errlen - n, ")");
            }
            goto done;
        }
        fp8t_checkpoint_prune(t->cfg.out_dir, t->cfg.keep_ckpts);
    }
    rc = 0;
done:
    rc = dp_agree(&t->dp, rc, err, errlen); /* every rank knows it is on disk, or stops */
out:
    /* a checkpoint holding NaN/Inf weights is never "the last good checkpoint" */
    if (rc == 0 && count_nonfinite(ck.params, ck.num_params) == 0)
        snprintf(t->last_ckpt, sizeof(t->last_ckpt), "%s", dir);
    fp8t_checkpoint_free(&ck);
    return rc;
}

/* Did the checkpoint's state use the hybrid format (E5M2 gradients)? Read from fmt_max of the
 * first dY tensor, which the state carries. */
static int checkpoint_hybrid(const fp8t_checkpoint *ck) {
    if (ck->fp8_n < 3) return -1;
    const float *fmt_max = ck->fp8_state + (size_t)(ck->fp8_len + 2) * ck->fp8_n;
    return fmt_max[FP8T_ROLE_DY] == FP8_E5M2_MAX;
}

/* Can the checkpoint's FP8 state be loaded into this run's model as it is? */
static int fp8_state_compatible(const trainer *t, const fp8t_checkpoint *ck) {
    return !t->cfg.resume_reset_fp8 && ck->fp8_len == t->cfg.policy.history_len &&
           ck->fp8_n == 3 * fp8t_model_num_linears(&t->cfg.model) && checkpoint_hybrid(ck) >= 0;
}

/* Copy a loaded checkpoint into the model (whose weight caches must be invalid: a fresh model
 * or one right after fp8t_model_end_step). */
static void load_into_model(trainer *t, const fp8t_checkpoint *ck, int with_fp8) {
    const fp8t_backend_ops *ops = t->be->ops;
    size_t pbytes = ck->num_params * sizeof(float);
    ops->to_device(t->be, fp8t_model_params(t->model), ck->params, pbytes);
    dp_adam_to_device(&t->dp, t->be, t->model, ck->adam_m, ck->adam_v, ck->adam_lo);
    if (with_fp8)
        ops->to_device(t->be, fp8t_model_fp8_state(t->model), ck->fp8_state,
                       fp8t_recipe_state_floats(ck->fp8_n, ck->fp8_len) * sizeof(float));
    ops->synchronize(t->be);
    fp8t_data_set_position(t->train, ck->data_position);
}

/* Shadow rollback: back to the newest checkpoint of this run (never one of the alarmed step:
 * the loop does not save that one), whose state is then re-run from in BF16. The checkpoint's
 * FP8 state goes in as a resume loads it: in the format it was written in (the run may have
 * been resumed from a checkpoint of the other format), then converted to this run's format by
 * the switch to the BF16 policy. */
/* A checkpoint with the moments this rank holds only (ZeRO-1: its shard; of a sharded
 * checkpoint only the shard files that overlap it are read, whatever N wrote them). */
static int load_checkpoint(const trainer *t, const char *dir, fp8t_checkpoint *ck, char *err,
                           size_t errlen) {
    size_t total = 0, lo, hi;
    fp8t_model_param_table(&t->cfg.model, NULL, &total);
    dp_moment_range(&t->dp, total, &lo, &hi);
    return fp8t_checkpoint_load_range(dir, &t->cfg.model, lo, hi, ck, err, errlen);
}

static int rollback(trainer *t, int *step, char *err, size_t errlen) {
    fp8t_checkpoint ck;
    if (load_checkpoint(t, t->last_ckpt, &ck, err, errlen) != 0) return -1;
    fp8t_model_end_step(t->model); /* invalidates the weight caches before the weights change */
    const int with_fp8 = ck.fp8_len == fp8t_model_fp8_history_len(t->model) &&
                         ck.fp8_n == fp8t_model_fp8_count(t->model) &&
                         checkpoint_hybrid(&ck) >= 0;
    if (with_fp8) {
        fp8t_policy as_saved = t->bf16_policy;
        as_saved.hybrid = checkpoint_hybrid(&ck);
        fp8t_model_set_policy(t->model, &as_saved);
    }
    load_into_model(t, &ck, with_fp8);
    fp8t_model_set_policy(t->model, &t->bf16_policy);
    t->in_bf16 = 1;
    *step = ck.step;
    fp8t_checkpoint_free(&ck);
    return 0;
}

/* ---------------------------------------------------------------- NaN / Inf */

/* The step's loss or gradients went non-finite before the optimizer update, so the weights
 * are still those the step started from: re-run its micro-batches with the NaN tracker in the
 * hook to name the first GEMM tensor that went non-finite. */
static void nan_stop(trainer *t, int step, uint64_t pos0, int bad_micro) {
    char where[256] = "";
    t->track_nan = 1;
    int inspect = t->hook_inspect;
    t->hook_inspect = 0; /* the statistics of this step were written on the first pass */
    update_hook(t);
    fp8t_nan_tracker_begin_step(t->nan, step);
    if (t->injector) fp8t_injector_begin_step(t->injector, step);
    /* each rank re-runs its own micro-batches up to the bad one; the first rank (in micro-batch
     * order) whose tracker names a tensor is the one reported */
    fp8t_data_set_position(t->train, pos0 + (uint64_t)t->dp.first_micro);
    fp8t_model_zero_grad(t->model);
    int last = bad_micro >= 0 ? bad_micro : t->accum - 1;
    if (last > t->dp.first_micro + t->dp.n_micro - 1)
        last = t->dp.first_micro + t->dp.n_micro - 1;
    for (int j = t->dp.first_micro; j <= last; j++) {
        fp8t_data_next(t->train, t->tokens, t->targets);
        fp8t_model_forward(t->model, t->tokens, t->targets);
        if (fp8t_nan_tracker_first(t->nan, where, sizeof(where))) break;
        fp8t_model_backward(t->model, 1.0f / (float)t->accum);
        if (fp8t_nan_tracker_first(t->nan, where, sizeof(where))) break;
    }
    dp_first_where(&t->dp, where, sizeof(where));
    t->track_nan = 0;
    t->hook_inspect = inspect;
    update_hook(t);
    char msg[768], advice[FP8T_TRAIN_PATH_BUF + 160];
    const char *what = bad_micro >= 0 ? "loss" : "gradient norm";
    if (where[0])
        snprintf(msg, sizeof(msg), "non-finite %s at step %d; first non-finite tensor: %s", what,
                 step, where);
    else
        snprintf(msg, sizeof(msg),
                 "non-finite %s at step %d; every GEMM tensor was finite, so it "
                 "arose outside the linear layers (softmax / cross-entropy, a norm, attention or "
                 "the embedding)",
                 what, step);
    if (t->last_ckpt[0])
        snprintf(advice, sizeof(advice),
                 "stopped; the last good checkpoint is %s (resume it, e.g. "
                 "with --precision bf16, for a recovery experiment)",
                 t->last_ckpt);
    else if (t->resume_nonfinite)
        snprintf(advice, sizeof(advice),
                 "stopped; there is no good checkpoint: the one this run "
                 "resumed from, %s, already holds %zu non-finite weights (re-import or re-export "
                 "them)",
                 t->cfg.resume, t->resume_nonfinite);
    else
        snprintf(advice, sizeof(advice),
                 "stopped; no checkpoint was written before the NaN (use "
                 "--ckpt-every N)");
    /* the event's extra keys, escaped by cJSON (a checkpoint path may hold any character) */
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "micro_batch", bad_micro);
    cJSON_AddStringToObject(o, "tensor", where);
    if (t->last_ckpt[0]) cJSON_AddStringToObject(o, "last_checkpoint", t->last_ckpt);
    cJSON_AddStringToObject(o, "advice", advice);
    char *json = cJSON_PrintUnformatted(o); /* {"micro_batch":..} -> ,"micro_batch":.. */
    if (json && json[0] == '{' && json[strlen(json) - 1] == '}') {
        json[0] = ',';
        json[strlen(json) - 1] = 0;
    }
    runlog_event(t, step, "nan", msg, json ? json : "");
    free(json);
    cJSON_Delete(o);
    /* the event above is the error; the advice is in events.jsonl, and on stderr unless quiet */
    if (!t->cfg.quiet) fprintf(stderr, "fp8train: %s\n", advice);
}

/* ---------------------------------------------------------------- metrics rows */

/* A metrics row of this step with nothing measured yet (NaN: not evaluated), in the precision
 * the model runs now. */
static step_record new_record(const trainer *t, int step, float lr, float grad_norm) {
    return (step_record){
        .step = step,
        .loss = NAN,
        .lr = lr,
        .grad_norm = grad_norm,
        .tokens_per_s = NAN,
        .val_loss = NAN,
        .shadow_loss = NAN,
        .shadow_gap = NAN,
        .drift_gap = NAN,
        .fallback = t->in_bf16,
        .precision = fp8t_precision_name(fp8t_model_get_policy(t->model)->default_precision)};
}

/* ---------------------------------------------------------------- progress */

static void format_duration(char *buf, size_t len, double s) {
    if (!isfinite(s) || s < 0) s = 0;
    long sec = (long)(s + 0.5);
    if (sec >= 3600)
        snprintf(buf, len, "%ldh%02ldm", sec / 3600, (sec / 60) % 60);
    else
        snprintf(buf, len, "%ldm%02lds", sec / 60, sec % 60);
}

/* tok/s and s/step are one measurement, over one window: the wall clock and the steps run
 * (re-runs after a rollback included) since the previous progress line, validation and
 * checkpoints included, so the two agree (tok/s = tokens per step / s per step) and the ETA
 * follows the current speed. metrics.jsonl's tokens_per_s is the last step's training time
 * alone. */
static void print_progress(trainer *t, const step_record *r) {
    char eta[32], val[32] = "";
    const double now = trainer_now(), per_tokens = (double)t->B * t->T * t->accum;
    const double dt = now - t->prog_t, steps = (t->tokens_done - t->prog_tokens) / per_tokens;
    const int left = t->cfg.steps - r->step;
    const double per_step = steps > 0 ? dt / steps : 0,
                 tok_s = dt > 0 ? steps * per_tokens / dt : 0;
    t->prog_t = now;
    t->prog_tokens = t->tokens_done;
    format_duration(eta, sizeof(eta), per_step * left);
    if (isfinite(t->last_val)) snprintf(val, sizeof(val), " | val %.4f", t->last_val);
    printf("step %*d/%d | loss %.4f%s | lr %.2e | %.0f tok/s | %.3f s/step (last %.0f step%s) | "
           "ETA %s%s\n",
           (int)snprintf(NULL, 0, "%d", t->cfg.steps), r->step, t->cfg.steps, r->loss, val, r->lr,
           tok_s, per_step, steps, steps == 1 ? "" : "s", eta,
           r->fallback ? " | BF16 fallback" : "");
    fflush(stdout);
}

static void print_banner(trainer *t, const fp8t_checkpoint *ck, const char *fp8_note) {
    const fp8t_model_config *m = &t->cfg.model;
    /* the Llama-3 / Qwen2 features only when used, so other banners read as before */
    char extra[96] = "";
    size_t ne = 0;
    if (fp8t_model_kv_heads(m) < m->n_head)
        ne +=
            (size_t)snprintf(extra + ne, sizeof(extra) - ne, " (%d KV)", fp8t_model_kv_heads(m));
    if (m->untied_head) ne += (size_t)snprintf(extra + ne, sizeof(extra) - ne, ", untied head");
    if (m->arch == FP8T_ARCH_LLAMA && m->qkv_bias)
        ne += (size_t)snprintf(extra + ne, sizeof(extra) - ne, ", qkv bias");
    if (m->arch == FP8T_ARCH_LLAMA && m->rope_scaling.type == FP8T_ROPE_LLAMA3)
        snprintf(extra + ne, sizeof(extra) - ne, ", llama3 rope x%g",
                 (double)m->rope_scaling.factor);
    printf("fp8train %s: training %s (%s, %d layers, C=%d, %d heads%s, V=%d, %.2fM parameters) "
           "on %s\n",
           FP8T_VERSION, t->cfg.init[0] ? t->cfg.init : t->cfg.preset, fp8t_arch_name(m->arch),
           m->n_layer, m->n_embd, m->n_head, extra, m->vocab_size,
           fp8t_model_num_params(t->model) / 1e6, t->be->name);
    printf("data: %s\n", fp8t_data_describe(t->train));
    printf("batch: B=%d T=%d grad_accum=%d (%d tokens per step), steps %d..%d, lr %g "
           "(warmup %d, cosine to %g)\n",
           t->B, t->T, t->accum, t->B * t->T * t->accum, t->start_step + 1, t->cfg.steps,
           t->cfg.lr, t->cfg.warmup, t->cfg.lr * t->cfg.min_lr_frac);
    char desc[8192];
    fp8t_policy_describe(&t->run_policy, desc, sizeof(desc));
    printf("precision policy:\n%s%s", desc,
           desc[0] && desc[strlen(desc) - 1] == '\n' ? "" : "\n");
    char dp_line[256];
    dp_describe(&t->dp, dp_line, sizeof(dp_line));
    if (dp_line[0]) printf("%s\n", dp_line);
    if (ck && !t->cfg.resume[0])
        printf("initialized from %s (fresh AdamW moments, step 0); %s\n", t->cfg.init, fp8_note);
    else if (ck)
        printf("resumed from %s at step %d; %s\n", t->cfg.resume, ck->step, fp8_note);
    printf("out: %s\n", t->cfg.out_dir);
#ifdef _OPENMP
    printf("threads: %d (OpenMP, OMP_WAIT_POLICY=%s)\n", omp_get_max_threads(),
           t->cfg.omp_wait_policy[0] ? t->cfg.omp_wait_policy : "unset");
#endif
    if (t->tb)
        printf("tensorboard: %s (tensorboard --logdir %s)\n", fp8t_tb_path(t->tb),
               t->cfg.tensorboard);
    fflush(stdout);
}

/* ---------------------------------------------------------------- setup / teardown */

static void trainer_free(trainer *t) {
    runlog_close(t);
    rundir_unlock(t);
    /* the instruments first: they observe the model and may hold backend memory (the NaN
     * tracker's device scalar), so they go before the model and the backend */
    fp8t_inspector_destroy(t->inspector);
    fp8t_injector_destroy(t->injector);
    fp8t_nan_tracker_destroy(t->nan);
    fp8t_model_destroy(t->model);
    dp_free(&t->dp, t->be);
    fp8t_backend_destroy(t->be);
    fp8t_data_close(t->train);
    fp8t_data_close(t->val);
    free(t->tokens);
    free(t->targets);
    spike_free(&t->spike);
    drift_free(&t->drift);
}

static int write_config(trainer *t, char *err, size_t errlen) {
    char path[FP8T_TRAIN_PATH_BUF];
    if (fp8t_fmt(path, sizeof(path), "%s/config.json", t->cfg.out_dir) != 0) {
        return fp8t_errorf(err, errlen, "--out path too long");
    }
    char *json = fp8t_train_config_to_json(&t->cfg);
    int rc = fp8t_write_file_atomic(path, json, strlen(json), err, errlen);
    free(json);
    return rc;
}

/* ---------------------------------------------------------------- the run */

/* --init: the weights of any fp8t_weights_load source as a checkpoint at step 0 (zero AdamW
 * moments, data position 0, the run's seed) that the resume path then loads; the source's FP8
 * state (a checkpoint's, or one seeded from an FP8 export's scales) comes along and is used
 * when it fits this run as a resumed one would be. */
static int init_checkpoint(const trainer *t, fp8t_checkpoint *ck, char *err, size_t errlen) {
    fp8t_weights w;
    char e[FP8T_ERR_LEN], why[512];
    memset(ck, 0, sizeof(*ck));
    if (fp8t_weights_load(t->cfg.init, &w, e, sizeof(e)) != 0) {
        return fp8t_errorf(err, errlen, "--init: %s", e);
    }
    if (fp8t_model_config_diff(&w.model, &t->cfg.model, why, sizeof(why)) != 0) {
        fp8t_errorf(err, errlen,
                    "--init %s: its model differs from the run's: %s (\"checkpoint\" "
                    "= the --init source)",
                    t->cfg.init, why);
        fp8t_weights_free(&w);
        return -1;
    }
    ck->seed = t->cfg.seed;
    ck->loss = NAN;
    ck->model = w.model;
    ck->num_params = w.num_params;
    ck->params = w.params;
    ck->fp8_n = w.fp8_n;
    ck->fp8_len = w.fp8_len;
    ck->fp8_state = w.fp8_state;
    w.params = NULL;
    w.fp8_state = NULL;
    fp8t_weights_free(&w);
    ck->adam_m = calloc(ck->num_params ? ck->num_params : 1, sizeof(float));
    ck->adam_v = calloc(ck->num_params ? ck->num_params : 1, sizeof(float));
    if (!ck->adam_m || !ck->adam_v) {
        fp8t_checkpoint_free(ck);
        return fp8t_errorf(err, errlen, "--init: out of memory");
    }
    return 0;
}

static void train_warning(void *ctx, const char *line) { runlog_warning(ctx, line); }

/* ---------------------------------------------------------------- the run, step by step */

/* 0. the trainer's state from the config (checked first) */
static int init_trainer(trainer *t, const fp8t_train_config *cfg, char *err, size_t errlen) {
    t->cfg = *cfg;
    t->last_val = NAN;
    t->lock_fd = -1;
    /* the library's warnings during the run go to events.jsonl too */
    fp8t_get_warn_handler(&t->prev_warn, &t->prev_warn_ctx);
    fp8t_set_warn_handler(train_warning, t);
    if (fp8t_train_config_check(&t->cfg, err, errlen) != 0) return -1;
    if (dp_setup(&t->dp, &t->cfg, err, errlen) != 0) return -1;
    t->B = t->cfg.batch;
    t->T = t->cfg.seq_len;
    t->accum = t->cfg.grad_accum;
    t->run_policy = t->cfg.policy;
    t->bf16_policy = t->cfg.policy;
    t->bf16_policy.default_precision = FP8T_PREC_BF16;
    t->bf16_policy.head_precision = FP8T_PREC_BF16;
    t->bf16_policy.n_overrides = 0;
    t->shadow_action = fp8t_shadow_action_parse(t->cfg.shadow_action, &t->fallback_steps);
    spike_init(&t->spike, t->cfg.spike_window, t->cfg.spike_z);
    return 0;
}

/* What the run starts from: the checkpoint of --resume / --init (have), and whether its FP8
 * state is loaded (load_fp8) */
typedef struct {
    fp8t_checkpoint ck;
    int have, from_init, load_fp8;
} start_point;

/* 1. everything that can be wrong with the inputs, before anything is written: the data, the
 * injector, the checkpoint to start from, the baseline, the backend and the model */
static int open_inputs(trainer *t, start_point *sp, char *err, size_t errlen) {
    fp8t_checkpoint *ck = &sp->ck;
    const int V = t->cfg.model.vocab_size;
    t->train = fp8t_data_open_tok(t->cfg.data, t->cfg.val_data, t->cfg.tokenizer,
                                  FP8T_SPLIT_TRAIN, t->B, t->T, V, t->cfg.seed, err, errlen);
    if (!t->train) return -1;
    if (t->cfg.val_every > 0) {
        t->val = fp8t_data_open_tok(t->cfg.data, t->cfg.val_data, t->cfg.tokenizer,
                                    FP8T_SPLIT_VAL, t->B, t->T, V, t->cfg.seed, err, errlen);
        if (!t->val) return -1;
    }
    char e[FP8T_ERR_LEN];
    if (t->cfg.inject[0]) {
        t->injector = fp8t_injector_create(t->cfg.inject, e, sizeof(e));
        if (!t->injector) return fp8t_errorf(err, errlen, "--inject: %s", e);
    }
    if (t->cfg.resume[0]) {
        if (load_checkpoint(t, t->cfg.resume, ck, e, sizeof(e)) != 0)
            return fp8t_errorf(err, errlen, "--resume: %s", e);
        sp->have = 1;
        if (ck->step >= t->cfg.steps)
            return fp8t_errorf(err, errlen,
                               "--resume %s is at step %d, but --steps %d is not "
                               "beyond it (--steps counts from the start of training)",
                               t->cfg.resume, ck->step, t->cfg.steps);
        t->start_step = ck->step;
    } else if (t->cfg.init[0]) {
        if (init_checkpoint(t, ck, err, errlen) != 0) return -1;
        sp->have = 1;
    }
    sp->from_init = sp->have && !t->cfg.resume[0];
    /* the model's shape is final here (a checkpoint may have set it) */
    if (t->injector && fp8t_injector_check_model(t->injector, &t->cfg.model, e, sizeof(e)))
        return fp8t_errorf(err, errlen, "--inject: %s", e);
    if (t->cfg.baseline[0] &&
        drift_load(&t->drift, t->cfg.baseline, t->start_step + 1, err, errlen) != 0)
        return -1;
    t->be = fp8t_backend_create(t->cfg.device, &t->cfg.backend_opts, err, errlen);
    if (!t->be) return -1;
    /* A checkpoint's FP8 state is loaded in the format it was written in; set_policy then
     * converts it when this run uses the other format (a recovery experiment may change it). */
    sp->load_fp8 = sp->have && fp8_state_compatible(t, ck);
    fp8t_policy create_policy = t->run_policy;
    if (sp->load_fp8) create_policy.hybrid = checkpoint_hybrid(ck);
    t->model = fp8t_model_create(t->be, &t->cfg.model, &create_policy, &t->cfg.model_opts, t->B,
                                 t->T, e, sizeof(e));
    if (!t->model) return fp8t_errorf(err, errlen, "cannot create the model: %s", e);
    if (dp_attach(&t->dp, t->be, t->model, &t->cfg.model, err, errlen) != 0) return -1;
    t->tokens = malloc((size_t)t->B * t->T * sizeof(int));
    t->targets = malloc((size_t)t->B * t->T * sizeof(int));
    t->nan = fp8t_nan_tracker_create();
    if (!t->tokens || !t->targets || !t->nan) return fp8t_errorf(err, errlen, "out of memory");
    return 0;
}

/* 2. the run directory (rank 0's): locked, and never another run's unless --overwrite; with
 * --inspect ranks=all each rank's statistics go to OUT/rank-R/ */
static int open_run_dir(trainer *t, int ck_step, char *err, size_t errlen) {
    int drc = 0;
    if (t->dp.rank == 0) drc = rundir_prepare(t, ck_step, err, errlen);
    if (dp_agree(&t->dp, drc, err, errlen) != 0) return -1;
    char idir[FP8T_TRAIN_PATH_BUF];
    snprintf(idir, sizeof(idir), "%s", t->cfg.out_dir);
    if (t->dp.rank != 0 && t->dp.inspect_all &&
        fp8t_fmt(idir, sizeof(idir), "%s/rank-%d", t->cfg.out_dir, t->dp.rank) != 0)
        drc = fp8t_errorf(err, errlen, "--out path too long");
    if (drc == 0 && t->cfg.inspect[0] && (t->dp.rank == 0 || t->dp.inspect_all)) {
        char e[FP8T_ERR_LEN];
        if (t->dp.rank != 0) drc = fp8t_mkdirs(idir, err, errlen);
        if (drc == 0)
            t->inspector = fp8t_inspector_create(t->dp.inspect_spec, idir, e, sizeof(e));
        fp8t_inspector_set_dump_budget(t->inspector, (size_t)t->cfg.inspect_dump_mb << 20);
        /* the injector may write a tensor between two sites that show it */
        fp8t_inspector_set_reuse(t->inspector, t->injector == NULL);
        if (drc == 0 && !t->inspector) drc = fp8t_errorf(err, errlen, "--inspect: %s", e);
        t->hook_inspect = t->inspector != NULL;
    }
    if (drc == 0 && t->dp.rank == 0 &&
        (write_config(t, err, errlen) != 0 || runlog_open(t, t->start_step, err, errlen) != 0 ||
         runlog_tb_open(t, err, errlen) != 0))
        drc = -1;
    return dp_agree(&t->dp, drc, err, errlen);
}

/* 3. the weights, fresh or from the checkpoint; the banner */
static void load_weights(trainer *t, start_point *sp) {
    fp8t_checkpoint *ck = &sp->ck;
    const char *fp8_note = "";
    char note[512];
    if (sp->have) {
        load_into_model(t, ck, sp->load_fp8);
        if (sp->load_fp8) {
            fp8t_model_set_policy(t->model, &t->run_policy);
            fp8_note = "FP8 scaling state restored";
        } else if (t->cfg.resume_reset_fp8) {
            fp8_note = "FP8 scaling state reset (--reset-fp8)";
        } else if (sp->from_init && ck->fp8_n == 0) {
            fp8_note = "fresh FP8 scaling state (the source has none)";
        } else {
            snprintf(note, sizeof(note),
                     "FP8 scaling state reset: the checkpoint's amax history "
                     "has length %d and this run's --amax-history is %d (resume with "
                     "--amax-history %d to carry it over)",
                     ck->fp8_len, t->cfg.policy.history_len, ck->fp8_len);
            fp8_note = note;
            if (!t->cfg.quiet) fprintf(stderr, "fp8train: %s\n", note);
        }
        /* an imported or damaged checkpoint may carry NaN/Inf weights: it is then no good
         * checkpoint to go back to, and the run is told so before its first step fails */
        t->resume_nonfinite = count_nonfinite(ck->params, ck->num_params);
        if (t->resume_nonfinite == 0 && !sp->from_init)
            snprintf(t->last_ckpt, sizeof(t->last_ckpt), "%s", t->cfg.resume);
        else
            fp8t_warnf("%s %s holds %zu non-finite weight%s (of %zu): training from it will go "
                       "non-finite; re-import or re-export the weights",
                       sp->from_init ? "--init" : "--resume",
                       sp->from_init ? t->cfg.init : t->cfg.resume, t->resume_nonfinite,
                       t->resume_nonfinite == 1 ? "" : "s", ck->num_params);
    } else {
        fp8t_model_init_weights(t->model, t->cfg.seed);
    }
    if (!t->cfg.quiet) print_banner(t, sp->have ? ck : NULL, fp8_note);
    if (sp->have) {
        fp8t_checkpoint_free(ck);
        sp->have = 0;
    }
    update_hook(t);
}

/* The start of step `step`: its precision (the policy, or BF16 after a shadow alarm) and the
 * instruments' step */
static void begin_step(trainer *t, int step) {
    t->step_now = step;
    int want_bf16 = t->fallback_left > 0 || step <= t->bf16_until;
    if (want_bf16 != t->in_bf16) {
        fp8t_model_set_policy(t->model, want_bf16 ? &t->bf16_policy : &t->run_policy);
        t->in_bf16 = want_bf16;
        if (!want_bf16)
            runlog_event(t, step, "fallback", "back to the configured precision policy", "");
    }
    if (t->injector) fp8t_injector_begin_step(t->injector, step);
    if (t->inspector) {
        fp8t_inspector_begin_step(t->inspector, step);
        update_hook(t);
    }
}

/* What one optimizer step measured */
typedef struct {
    float lr, norm;
    float loss;        /* mean over the micro-batches */
    float loss0;       /* the first micro-batch's (the shadow forward's batch) */
    float shadow_loss; /* NaN: no shadow this step */
    double step_s, tokens_per_s, drift_gap;
} step_outcome;

/* The optimizer step: the micro-batches' forward and backward (and the shadow forward), the
 * gradient reduction and norm, AdamW, the FP8 scale update, the online detectors. 0, or 1
 * when a loss or the gradient went non-finite under --detect-nan: the NaN stop has run and
 * written its row, and the run ends. */
static int optimizer_step(trainer *t, int step, step_outcome *o) {
    const double tokens_per_step = (double)t->B * t->T * t->accum;
    const double ts = trainer_now();
    const uint64_t pos0 = fp8t_data_position(t->train);
    o->lr = fp8t_lr_at(&t->cfg, step);
    const int shadow_now =
        t->cfg.shadow_every > 0 && step % t->cfg.shadow_every == 0 && !t->in_bf16;
    o->loss0 = o->shadow_loss = NAN;
    double loss_sum = 0;
    int bad_micro = -1;
    fp8t_model_zero_grad(t->model);
    /* this rank's slice of the global batch: micro-batches [first, first + n) of accum */
    const int j0 = t->dp.first_micro, j1 = j0 + t->dp.n_micro;
    float *micro_loss = t->dp.losses;
    for (int j = 0; j < t->accum; j++) micro_loss[j] = NAN;
    fp8t_data_set_position(t->train, pos0 + (uint64_t)j0);
    for (int j = j0; j < j1; j++) {
        fp8t_data_next(t->train, t->tokens, t->targets);
        if (j == 0 && shadow_now) o->shadow_loss = shadow_forward(t);
        float l = fp8t_model_forward(t->model, t->tokens, t->targets);
        micro_loss[j] = l;
        if (!isfinite(l) && t->cfg.detect_nan) break;
        /* only the last micro-batch's backward reduces (its buckets, as it goes) */
        if (j == j1 - 1) dp_grads_arm(&t->dp, t->model);
        fp8t_model_backward(t->model, 1.0f / (float)t->accum);
    }
    dp_grads_flush(&t->dp, t->model);
    fp8t_data_set_position(t->train, pos0 + (uint64_t)t->accum);
    /* every rank sees every micro-batch's loss and sums them in the one order */
    dp_gather_losses(&t->dp, t->accum);
    if (shadow_now) o->shadow_loss = dp_bcast_float(&t->dp, o->shadow_loss, 0);
    for (int j = 0; j < t->accum; j++) {
        float l = micro_loss[j];
        if (!isfinite(l) && t->cfg.detect_nan) {
            bad_micro = j;
            break;
        }
        if (j == 0) o->loss0 = l;
        loss_sum += l;
    }
    o->norm = NAN;
    if (bad_micro < 0)
        o->norm = dp_grad_norm(&t->dp, t->be, t->model);
    else
        dp_grads_wait(&t->dp); /* the NaN re-run rewrites the gradients */
    if (t->cfg.detect_nan && (bad_micro >= 0 || !isfinite(o->norm))) {
        if (t->inspector) fp8t_inspector_end_step(t->inspector, step);
        nan_stop(t, step, pos0, bad_micro);
        step_record r = new_record(t, step, o->lr, o->norm);
        r.nonfinite = 1;
        r.elapsed_s = trainer_now() - t->t0;
        runlog_metrics(t, &r);
        runlog_tb_step(t, &r);
        return 1;
    }
    dp_adamw(&t->dp, t->be, t->model, o->lr, t->cfg.beta1, t->cfg.beta2, t->cfg.adam_eps,
             t->cfg.weight_decay, step, t->cfg.grad_clip, o->norm);
    if (t->injector) fp8t_injector_before_scale_update(t->injector, t->model, step);
    dp_reduce_amax(&t->dp, t->be, t->model);
    if (t->inspector) fp8t_inspector_before_scale_update(t->inspector, t->model, step);
    fp8t_model_end_step(t->model);
    if (t->inspector) fp8t_inspector_end_step(t->inspector, step);
    o->loss = (float)(loss_sum / t->accum);
    /* the online detectors judge the step inside its time (tokens_per_s counts them) */
    o->drift_gap = drift_observe(t, step, o->loss);
    spike_observe(t, step, o->loss);
    o->step_s = trainer_now() - ts;
    t->train_seconds += o->step_s;
    t->tokens_done += tokens_per_step;
    o->tokens_per_s = tokens_per_step / o->step_s;
    return 0;
}

/* The step's metrics row (with validation where due), written */
static step_record log_step(trainer *t, int step, const step_outcome *o, fp8t_train_result *res) {
    step_record r = new_record(t, step, o->lr, o->norm);
    r.loss = o->loss;
    r.nonfinite = !isfinite(o->loss);
    r.tokens_per_s = o->tokens_per_s;
    r.shadow_loss = o->shadow_loss;
    if (t->val && (step % t->cfg.val_every == 0 || step == t->cfg.steps)) {
        r.val_loss = validate(t);
        t->last_val = r.val_loss;
        res->last_val_loss = r.val_loss;
    }
    if (isfinite(o->shadow_loss))
        r.shadow_gap = fabsf(o->loss0 - o->shadow_loss) / o->shadow_loss;
    r.drift_gap = o->drift_gap;
    r.elapsed_s = trainer_now() - t->t0;
    runlog_metrics(t, &r);
    runlog_tb_step(t, &r);
    res->last_step = step;
    res->last_loss = o->loss;
    return r;
}

/* The shadow BF16 judgement of a step whose gap was measured: a fallback to BF16 for some
 * steps, a rollback (returns 1: the caller rolls back), or a warning event */
static int judge_shadow(trainer *t, int step, const step_outcome *o, const step_record *r) {
    int do_rollback = 0;
    if (isfinite(r->shadow_gap) && r->shadow_gap > t->cfg.shadow_threshold) {
        char msg[FP8T_TRAIN_PATH_BUF + 512], extra[160];
        snprintf(extra, sizeof(extra), ",\"loss\":%.9g,\"shadow_loss\":%.9g,\"gap\":%.6g",
                 o->loss0, o->shadow_loss, r->shadow_gap);
        snprintf(msg, sizeof(msg),
                 "FP8 loss %.4f vs BF16 %.4f on the same batch: gap %.2f%% "
                 "> %.2f%%",
                 o->loss0, o->shadow_loss, 100 * r->shadow_gap, 100 * t->cfg.shadow_threshold);
        if (t->shadow_action == 1) {
            t->fallback_left = t->fallback_steps;
            size_t n = strlen(msg);
            snprintf(msg + n, sizeof(msg) - n, "; running the next %d steps in BF16",
                     t->fallback_steps);
            runlog_event(t, step, "fallback", msg, extra);
        } else if (t->shadow_action == 2 && t->last_ckpt[0] && t->rollbacks < MAX_ROLLBACKS) {
            size_t n = strlen(msg);
            snprintf(msg + n, sizeof(msg) - n,
                     "; rolling back to %s and re-running up to "
                     "step %d in BF16",
                     t->last_ckpt, step);
            runlog_event(t, step, "rollback", msg, extra);
            do_rollback = 1;
        } else {
            if (t->shadow_action == 2) {
                size_t n = strlen(msg);
                snprintf(msg + n, sizeof(msg) - n,
                         t->last_ckpt[0]
                             ? "; too many rollbacks, only warning now"
                             : "; no checkpoint to roll back to yet (use --ckpt-every)");
            }
            runlog_event(t, step, "shadow", msg, extra);
        }
    } else if (t->in_bf16 && t->fallback_left > 0) {
        t->fallback_left--;
    }
    return do_rollback;
}

/* The end of a step: stop on a log that could not be written, the checkpoint where due (not
 * of a state a rollback is about to undo), the progress line, the rollback. -1 with err on an
 * error; after a rollback *step is the checkpoint's step (the loop goes on after it). */
static int end_step(trainer *t, int *step, const step_record *r, int do_rollback, char *err,
                    size_t errlen) {
    const int s = *step;
    /* a log could not be written (disk full): stop before anything more is lost */
    const char *insp_err = fp8t_inspector_write_error(t->inspector);
    if (insp_err && !t->write_err[0])
        snprintf(t->write_err, sizeof(t->write_err),
                 "%s; training stopped at step %d. Free "
                 "space on that file system (or raise ulimit -f)",
                 insp_err, s);
    if (t->write_err[0]) return fp8t_errorf(err, errlen, "%s", t->write_err);
    /* not the state a rollback is about to undo: as the newest checkpoint it would be the
     * one reloaded, and nothing re-run (and --keep-ckpts could prune the good one) */
    if (!do_rollback &&
        ((t->cfg.ckpt_every > 0 && s % t->cfg.ckpt_every == 0) || s == t->cfg.steps) &&
        save_checkpoint(t, s, r->loss, err, errlen) != 0)
        return -1;
    if (!t->cfg.quiet &&
        (s % t->cfg.progress_every == 0 || s == t->cfg.steps || s == t->start_step + 1))
        print_progress(t, r);
    if (do_rollback) {
        int back;
        if (rollback(t, &back, err, errlen) != 0) return -1;
        t->rollbacks++;
        t->bf16_until = s;
        t->fallback_left = 0;
        /* the steps after the checkpoint are re-run: TensorBoard drops their first take */
        runlog_tb_restart(t, back + 1);
        *step = back;
    }
    return 0;
}

/* 5. after the loop: the last inspected step's lines, a log that could not be written, the
 * TensorBoard file closed */
static int finish_run(trainer *t, fp8t_train_result *res, char *err, size_t errlen) {
    if (t->inspector) { /* the last inspected step's lines (end_step may leave them) */
        fp8t_inspector_flush(t->inspector);
        const char *insp_err = fp8t_inspector_write_error(t->inspector);
        if (insp_err && !t->write_err[0])
            snprintf(t->write_err, sizeof(t->write_err), "%s", insp_err);
    }
    /* the NaN stop's rows, or a fallback event of the last step */
    if (t->write_err[0]) return fp8t_errorf(err, errlen, "%s", t->write_err);
    res->tokens_per_s = t->train_seconds > 0 ? t->tokens_done / t->train_seconds : 0;
    return runlog_tb_close(t, err, errlen);
}

int fp8t_train_run(const fp8t_train_config *cfg, fp8t_train_result *res, char *err,
                   size_t errlen) {
    trainer *t = calloc(1, sizeof(*t));
    start_point sp;
    memset(&sp, 0, sizeof(sp));
    int rc = -1;
    memset(res, 0, sizeof(*res));
    res->reason = FP8T_STOP_ERROR;
    res->last_loss = res->last_val_loss = NAN;
    if (!t) return fp8t_errorf(err, errlen, "out of memory");
    if (init_trainer(t, cfg, err, errlen) != 0 || open_inputs(t, &sp, err, errlen) != 0 ||
        open_run_dir(t, sp.have ? sp.ck.step : 0, err, errlen) != 0)
        goto done;
    load_weights(t, &sp);

    /* 4. the loop */
    res->reason = FP8T_STOP_DONE;
    t->t0 = trainer_now();
    t->prog_t = t->t0;
    t->prog_tokens = 0;
    for (int step = t->start_step + 1; step <= t->cfg.steps; step++) {
        begin_step(t, step);
        step_outcome o;
        if (optimizer_step(t, step, &o) != 0) {
            res->reason = FP8T_STOP_NAN;
            res->last_step = step - 1;
            break;
        }
        const step_record r = log_step(t, step, &o, res);
        const int do_rollback = judge_shadow(t, step, &o, &r);
        if (end_step(t, &step, &r, do_rollback, err, errlen) != 0) goto done;
    }
    if (finish_run(t, res, err, errlen) != 0) goto done;
    rc = 0;
done:
    if (rc != 0) res->reason = FP8T_STOP_ERROR;
    res->n_events = t->n_events;
    if (sp.have) fp8t_checkpoint_free(&sp.ck);
    fp8t_set_warn_handler(t->prev_warn, t->prev_warn_ctx);
    trainer_free(t);
    free(t);
    return rc;
}
