/* Writing a run's logs: metrics.jsonl (one object per step) and events.jsonl (one object per
 * detector event). Lines are flushed as they are written, so a crashed run keeps every
 * completed step. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/io.h"
#include "train/trainer_internal.h"

/* Is the checkpoint directory inside OUT/checkpoints (a resume into the run that wrote it)? */
static int resume_is_same_run(const char *out_dir, const char *ckpt) {
    char a[PATH_MAX], b[PATH_MAX], sub[FP8T_TRAIN_PATH_BUF];
    if (fp8t_fmt(sub, sizeof(sub), "%s/checkpoints", out_dir) != 0) return 0;
    if (!realpath(sub, a) || !realpath(ckpt, b)) return 0;
    size_t n = strlen(a);
    return strncmp(a, b, n) == 0 && b[n] == '/';
}

/* Keep the lines of `path` whose "step" is <= max_step; feed their losses to `spike` (may be
 * NULL). Rewrites the file atomically. */
static int keep_prefix(const char *path, int max_step, spike_state *spike, char *err,
                       size_t errlen) {
    char *text = NULL;
    size_t len = 0;
    char e[512];
    if (fp8t_read_file(path, &text, &len, e, sizeof(e)) != 0) return 0; /* no file: nothing */
    char *out = malloc(len + 1);
    if (!out) {
        free(text);
        snprintf(err, errlen, "out of memory reading %s", path);
        return -1;
    }
    size_t o = 0;
    char *line = text;
    while (line && *line) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        cJSON *j = cJSON_Parse(line);
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(j, "step");
        if (cJSON_IsNumber(step) && step->valuedouble <= max_step) {
            size_t n = strlen(line);
            memcpy(out + o, line, n);
            o += n;
            out[o++] = '\n';
            const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "loss");
            if (spike && cJSON_IsNumber(loss)) spike_push(spike, loss->valuedouble);
        }
        cJSON_Delete(j);
        line = nl ? nl + 1 : NULL;
    }
    int rc = fp8t_write_file_atomic(path, out, o, err, errlen);
    free(out);
    free(text);
    return rc;
}

int runlog_open(trainer *t, int resume_step, char *err, size_t errlen) {
    char mpath[FP8T_TRAIN_PATH_BUF], epath[FP8T_TRAIN_PATH_BUF];
    if (fp8t_fmt(mpath, sizeof(mpath), "%s/metrics.jsonl", t->cfg.out_dir) != 0 ||
        fp8t_fmt(epath, sizeof(epath), "%s/events.jsonl", t->cfg.out_dir) != 0) {
        snprintf(err, errlen, "--out path too long");
        return -1;
    }
    int keep = resume_step > 0 && resume_is_same_run(t->cfg.out_dir, t->cfg.resume);
    if (keep) {
        if (keep_prefix(mpath, resume_step, &t->spike, err, errlen) != 0 ||
            keep_prefix(epath, resume_step, NULL, err, errlen) != 0)
            return -1;
    }
    t->metrics = fopen(mpath, keep ? "a" : "w");
    t->events = t->metrics ? fopen(epath, keep ? "a" : "w") : NULL;
    if (!t->metrics || !t->events) {
        snprintf(err, errlen, "cannot open %s for writing", t->metrics ? epath : mpath);
        runlog_close(t);
        return -1;
    }
    return 0;
}

void runlog_close(trainer *t) {
    if (t->metrics) fclose(t->metrics);
    if (t->events) fclose(t->events);
    t->metrics = t->events = NULL;
    char e[16];
    fp8t_tb_close(t->tb, e, sizeof(e)); /* an error path: a close error adds nothing */
    t->tb = NULL;
}

/* Append ,"key":value to buf at *o (floats with 9 significant digits: a float32 round-trips
 * exactly, so two runs' losses can be compared bit for bit from the logs). */
static void put_num(char *buf, size_t len, size_t *o, const char *key, double v, int digits) {
    if (*o >= len) return;
    if (isfinite(v)) *o += (size_t)snprintf(buf + *o, len - *o, ",\"%s\":%.*g", key, digits, v);
    else *o += (size_t)snprintf(buf + *o, len - *o, ",\"%s\":null", key);
}

void runlog_metrics(trainer *t, const step_record *r) {
    if (!t->metrics) return;
    char buf[1024];
    size_t o = (size_t)snprintf(buf, sizeof(buf), "{\"step\":%d", r->step);
    put_num(buf, sizeof(buf), &o, "loss", r->nonfinite ? NAN : r->loss, 9);
    put_num(buf, sizeof(buf), &o, "lr", r->lr, 9);
    put_num(buf, sizeof(buf), &o, "grad_norm", r->grad_norm, 9);
    put_num(buf, sizeof(buf), &o, "tokens_per_s", r->tokens_per_s, 6);
    put_num(buf, sizeof(buf), &o, "elapsed_s", r->elapsed_s, 6);
    if (o < sizeof(buf))
        o += (size_t)snprintf(buf + o, sizeof(buf) - o, ",\"precision\":\"%s\"", r->precision);
    if (!isnan(r->val_loss)) put_num(buf, sizeof(buf), &o, "val_loss", r->val_loss, 9);
    if (!isnan(r->shadow_loss)) {
        put_num(buf, sizeof(buf), &o, "shadow_loss", r->shadow_loss, 9);
        put_num(buf, sizeof(buf), &o, "shadow_gap", r->shadow_gap, 6);
    }
    if (!isnan(r->drift_gap)) put_num(buf, sizeof(buf), &o, "drift_gap", r->drift_gap, 6);
    if (r->fallback && o < sizeof(buf)) o += (size_t)snprintf(buf + o, sizeof(buf) - o, ",\"fallback\":true");
    if (r->nonfinite && o < sizeof(buf)) o += (size_t)snprintf(buf + o, sizeof(buf) - o, ",\"nonfinite\":true");
    if (o < sizeof(buf)) snprintf(buf + o, sizeof(buf) - o, "}");
    fprintf(t->metrics, "%s\n", buf);
    fflush(t->metrics);
}

void runlog_event(trainer *t, int step, const char *kind, const char *message, const char *extra) {
    t->n_events++;
    if (!t->events) return;
    cJSON *s = cJSON_CreateString(message); /* escapes the message */
    char *msg = cJSON_PrintUnformatted(s);
    fprintf(t->events, "{\"step\":%d,\"kind\":\"%s\",\"message\":%s%s,\"elapsed_s\":%.3f}\n", step,
            kind, msg ? msg : "\"\"", extra ? extra : "", trainer_now() - t->t0);
    fflush(t->events);
    free(msg);
    cJSON_Delete(s);
    if (!t->cfg.quiet || !strcmp(kind, "nan")) fprintf(stderr, "fp8train: step %d: %s: %s\n", step, kind, message);
}

/* ---------------------------------------------------------------- TensorBoard */

/* The inspector's statistics of a step, queued for the step's event as
 * inspect/<site>/<statistic>: TensorBoard groups tags by their first component, so every
 * statistic of the run lands in one "inspect" section, and its tag filter selects by site
 * ("layer03.fc2") or by statistic ("underflow_pct"). */
static void tb_inspect_sink(void *ctx, int step, const char *site, const char *stat,
                            double value) {
    trainer *t = ctx;
    (void)step; /* queued for the step runlog_tb_step writes next: the same step */
    char tag[256];
    if (fp8t_fmt(tag, sizeof(tag), "inspect/%s/%s", site, stat) != 0) return;
    fp8t_tb_add(t->tb, tag, value); /* out of memory is reported by the step's write */
}

int runlog_tb_open(trainer *t, char *err, size_t errlen) {
    if (!t->cfg.tensorboard[0]) return 0;
    t->tb = fp8t_tb_open(t->cfg.tensorboard, err, errlen);
    if (!t->tb) return -1;
    /* a resume re-runs the steps after its checkpoint, a fresh run all of them: what an earlier
     * run left in the directory for those steps is superseded */
    if (fp8t_tb_session_start(t->tb, t->start_step + 1, err, errlen) != 0) return -1;
    if (t->inspector) fp8t_inspector_set_sink(t->inspector, tb_inspect_sink, t);
    return 0;
}

int runlog_tb_step(trainer *t, const step_record *r, char *err, size_t errlen) {
    if (!t->tb) return 0;
    /* As metrics.jsonl has them, but what was not measured this step is left out rather than
     * written as NaN (a chart would show a gap marker at every step without validation). A
     * non-finite loss or gradient norm is written: that point is the news. */
    fp8t_tb_add(t->tb, "loss", r->loss);
    fp8t_tb_add(t->tb, "lr", r->lr);
    fp8t_tb_add(t->tb, "grad_norm", r->grad_norm);
    if (isfinite(r->tokens_per_s)) fp8t_tb_add(t->tb, "tokens_per_s", r->tokens_per_s);
    if (!isnan(r->val_loss)) fp8t_tb_add(t->tb, "val_loss", r->val_loss);
    if (!isnan(r->shadow_loss)) {
        fp8t_tb_add(t->tb, "shadow_loss", r->shadow_loss);
        fp8t_tb_add(t->tb, "shadow_gap", r->shadow_gap);
    }
    if (!isnan(r->drift_gap)) fp8t_tb_add(t->tb, "drift_gap", r->drift_gap);
    return fp8t_tb_write_step(t->tb, r->step, err, errlen);
}

int runlog_tb_close(trainer *t, char *err, size_t errlen) {
    int rc = fp8t_tb_close(t->tb, err, errlen);
    t->tb = NULL;
    return rc;
}
