/* Writing a run's logs: metrics.jsonl (one object per step) and events.jsonl (one object per
 * detector event). Lines are flushed as they are written, so a crashed run keeps every
 * completed step. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fp8train/error.h"
#include "fp8train/io.h"
#include "train/trainer_internal.h"
#include "util/fs.h"

/* Append len bytes to the file `path` (created with its directory), checking every write. */
static int append_file(const char *path, const char *data, size_t len, char *err, size_t errlen) {
    char dir[FP8T_TRAIN_PATH_BUF];
    if (fp8t_fmt(dir, sizeof(dir), "%s", path) != 0)
        return fp8t_errorf(err, errlen, "path too long: %s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = 0;
        if (fp8t_mkdirs(dir, err, errlen) != 0) return -1;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0) return fp8t_errorf(err, errlen, "cannot create %s: %s", path, strerror(errno));
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = n < 0 ? errno : ENOSPC;
            close(fd);
            return fp8t_errorf(err, errlen, "cannot write %s: %s", path, strerror(e));
        }
        data += n;
        len -= (size_t)n;
    }
    if (close(fd) != 0)
        return fp8t_errorf(err, errlen, "cannot write %s: %s", path, strerror(errno));
    return 0;
}

int runlog_keep_prefix(const char *path, int max_step, spike_state *spike, const char *aside,
                       char *err, size_t errlen) {
    char *text = NULL;
    size_t len = 0;
    char e[FP8T_ERR_LEN];
    if (fp8t_read_file(path, &text, &len, e, sizeof(e)) != 0) return 0; /* no file: nothing */
    char *out = malloc(len + 1), *later = malloc(len + 1);
    if (!out || !later) {
        free(out);
        free(later);
        free(text);
        return fp8t_errorf(err, errlen, "out of memory reading %s", path);
    }
    size_t o = 0, lo = 0;
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
        } else if (*line) {
            /* a later step, or a line that is not a row (torn by a crash): not this run's
             * past, but not deleted either */
            size_t n = strlen(line);
            memcpy(later + lo, line, n);
            lo += n;
            later[lo++] = '\n';
        }
        cJSON_Delete(j);
        line = nl ? nl + 1 : NULL;
    }
    /* aside first: if it cannot be written, the original is still whole */
    int rc = 0;
    if (lo && aside) rc = append_file(aside, later, lo, err, errlen);
    if (rc == 0 && (lo || o != len)) rc = fp8t_write_file_atomic(path, out, o, err, errlen);
    free(out);
    free(later);
    free(text);
    return rc;
}

int runlog_open(trainer *t, int resume_step, char *err, size_t errlen) {
    char mpath[FP8T_TRAIN_PATH_BUF], epath[FP8T_TRAIN_PATH_BUF];
    if (fp8t_fmt(mpath, sizeof(mpath), "%s/metrics.jsonl", t->cfg.out_dir) != 0 ||
        fp8t_fmt(epath, sizeof(epath), "%s/events.jsonl", t->cfg.out_dir) != 0) {
        return fp8t_errorf(err, errlen, "--out path too long");
    }
    int keep = resume_step > 0 && t->same_run;
    if (keep) {
        char maside[FP8T_TRAIN_PATH_BUF], easide[FP8T_TRAIN_PATH_BUF];
        if (fp8t_fmt(maside, sizeof(maside), "%s/metrics.jsonl", t->aside_dir) != 0 ||
            fp8t_fmt(easide, sizeof(easide), "%s/events.jsonl", t->aside_dir) != 0) {
            return fp8t_errorf(err, errlen, "--out path too long");
        }
        if (runlog_keep_prefix(mpath, resume_step, &t->spike, maside, err, errlen) != 0 ||
            runlog_keep_prefix(epath, resume_step, NULL, easide, err, errlen) != 0)
            return -1;
        if (fp8t_is_dir(t->aside_dir) && !t->cfg.quiet)
            fprintf(stderr,
                    "fp8train: resuming step %d of the run in %s: what it did after "
                    "step %d (%d checkpoint%s, its log rows) moved to %s\n",
                    resume_step, t->cfg.out_dir, resume_step, t->moved_ckpts,
                    t->moved_ckpts == 1 ? "" : "s", t->aside_dir);
    }
    t->metrics = fopen(mpath, keep ? "a" : "w");
    t->events = t->metrics ? fopen(epath, keep ? "a" : "w") : NULL;
    if (!t->metrics || !t->events) {
        fp8t_errorf(err, errlen, "cannot open %s for writing", t->metrics ? epath : mpath);
        runlog_close(t);
        return -1;
    }
    return 0;
}

/* Append one line to a log with write(2) (stdio would keep part of a line in its buffer after
 * a failure and write it later). On a failure (disk full, file size limit) the file is cut
 * back to where the line began, so it ends in a whole line, and t->write_err says which file
 * failed: the training loop stops on it. */
static void append_line(trainer *t, FILE *f, const char *name, const char *line) {
    if (t->write_err[0]) return; /* stopped writing at the first failure */
    int fd = fileno(f);
    off_t start = lseek(fd, 0, SEEK_END);
    size_t len = strlen(line), done = 0;
    while (done < len) {
        ssize_t n = write(fd, line + done, len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = n < 0 ? errno : ENOSPC;
            /* if even the truncation fails, the part written stays: the reader of metrics
             * (fp8t_metrics_read) skips a torn last line with a warning */
            if (start >= 0 && ftruncate(fd, start) != 0) {
            }
            snprintf(t->write_err, sizeof(t->write_err),
                     "cannot append to %s/%s: %s; training "
                     "stopped (%s ends at its last complete line). Free space on that file "
                     "system (or raise the file size limit, ulimit -f), then %s%s",
                     t->cfg.out_dir, name, strerror(e), name,
                     t->last_ckpt[0] ? "continue with --resume "
                                     : "start again (no checkpoint was written yet)",
                     t->last_ckpt);
            return;
        }
        done += (size_t)n;
    }
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
    if (isfinite(v))
        *o += (size_t)snprintf(buf + *o, len - *o, ",\"%s\":%.*g", key, digits, v);
    else
        *o += (size_t)snprintf(buf + *o, len - *o, ",\"%s\":null", key);
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
    if (r->fallback && o < sizeof(buf))
        o += (size_t)snprintf(buf + o, sizeof(buf) - o, ",\"fallback\":true");
    if (r->nonfinite && o < sizeof(buf))
        o += (size_t)snprintf(buf + o, sizeof(buf) - o, ",\"nonfinite\":true");
    if (o < sizeof(buf)) o += (size_t)snprintf(buf + o, sizeof(buf) - o, "}\n");
    append_line(t, t->metrics, "metrics.jsonl", buf);
}

/* One line of events.jsonl (once the file is open): the message escaped, extra (",key":value
 * pairs, may be NULL) after it */
static void write_event(trainer *t, int step, const char *kind, const char *message,
                        const char *extra) {
    if (!t->events) return;
    cJSON *s = cJSON_CreateString(message); /* escapes the message */
    char *msg = cJSON_PrintUnformatted(s);
    const char *fmt = "{\"step\":%d,\"kind\":\"%s\",\"message\":%s%s,\"elapsed_s\":%.3f}\n";
    const double el = trainer_now() - t->t0;
    const char *m = msg ? msg : "\"\"", *x = extra ? extra : "";
    int n = snprintf(NULL, 0, fmt, step, kind, m, x, el);
    char *line = n > 0 ? malloc((size_t)n + 1) : NULL;
    if (line) {
        snprintf(line, (size_t)n + 1, fmt, step, kind, m, x, el);
        append_line(t, t->events, "events.jsonl", line);
    } else if (!t->write_err[0]) {
        snprintf(t->write_err, sizeof(t->write_err), "out of memory writing %s/events.jsonl",
                 t->cfg.out_dir);
    }
    free(line);
    free(msg);
    cJSON_Delete(s);
}

/* A warning of the library during the run (fp8t_warnf): always on stderr, and a line of
 * events.jsonl (kind "warning") once the file is open; not counted as a detector event. */
void runlog_warning(trainer *t, const char *line) {
    if (t->step_now > 0)
        fprintf(stderr, "fp8train: step %d: warning: %s\n", t->step_now, line);
    else
        fprintf(stderr, "fp8train: warning: %s\n", line);
    write_event(t, t->step_now, "warning", line, NULL);
}

void runlog_event(trainer *t, int step, const char *kind, const char *message,
                  const char *extra) {
    t->n_events++;
    write_event(t, step, kind, message, extra);
    if (!t->cfg.quiet || !strcmp(kind, "nan"))
        fprintf(stderr, "fp8train: step %d: %s: %s\n", step, kind, message);
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

/* A failed event write: the loop stops on t->write_err, as for the other logs. */
static void tb_failed(trainer *t, const char *e, int step) {
    if (t->write_err[0]) return;
    snprintf(t->write_err, sizeof(t->write_err),
             "%s; training stopped at step %d. Free space "
             "on that file system (or raise ulimit -f), then %s%s",
             e, step,
             t->last_ckpt[0] ? "continue with --resume "
                             : "start again (no checkpoint was "
                               "written yet)",
             t->last_ckpt);
}

void runlog_tb_step(trainer *t, const step_record *r) {
    if (!t->tb || t->write_err[0]) return;
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
    char e[FP8T_ERR_LEN];
    if (fp8t_tb_write_step(t->tb, r->step, e, sizeof(e)) != 0) tb_failed(t, e, r->step);
}

void runlog_tb_restart(trainer *t, int step) {
    char e[FP8T_ERR_LEN];
    if (t->tb && !t->write_err[0] && fp8t_tb_session_start(t->tb, step, e, sizeof(e)) != 0)
        tb_failed(t, e, step);
}

int runlog_tb_close(trainer *t, char *err, size_t errlen) {
    int rc = fp8t_tb_close(t->tb, err, errlen);
    t->tb = NULL;
    return rc;
}
