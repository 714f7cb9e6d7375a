/* Detectors that judge each step as it completes: loss spikes (robust z-score over a window,
 * then the steps it takes to come back) and drift against a baseline run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fp8train/compare.h"
#include "fp8train/error.h"
#include "train/trainer_internal.h"

/* ---------------------------------------------------------------- spikes */

/* Back "under median + margin" means within this many robust sigmas of the pre-spike window. */
#define SPIKE_RECOVER_SIGMAS 3.0
/* Fewer samples than this say nothing about the spread. Small on purpose: the detector takes
 * the window's trend out (fp8t_spike_check), so the falling loss of the first steps is no
 * reason to stay blind there (a spike at step 19 must be seen). */
#define SPIKE_MIN_SAMPLES 5

void spike_init(spike_state *s, int window, double z) {
    memset(s, 0, sizeof(*s));
    s->cfg.window = window;
    s->cfg.z = z;
    s->cap = window > 0 ? window : 50;
    s->hist = calloc((size_t)s->cap, sizeof(double));
}

void spike_free(spike_state *s) {
    free(s->hist);
    s->hist = NULL;
}

void spike_push(spike_state *s, double loss) {
    if (!s->hist || !isfinite(loss)) return;
    if (s->n == s->cap) {
        memmove(s->hist, s->hist + 1, (size_t)(s->cap - 1) * sizeof(double));
        s->n--;
    }
    s->hist[s->n++] = loss;
}

void spike_observe(trainer *t, int step, double loss) {
    spike_state *s = &t->spike;
    if (s->cfg.window == 0) return; /* --spike-window 0: off */
    char msg[256], extra[160];
    if (s->in_spike) {
        if (loss < s->recover_below) {
            int n = step - s->spike_step;
            snprintf(msg, sizeof(msg),
                     "loss back to %.4f (under %.4f) %d step%s after the spike "
                     "at step %d%s",
                     loss, s->recover_below, n, n == 1 ? "" : "s", s->spike_step,
                     n > 20 ? "; slow recovery points at numerics (try fp8train bisect)" : "");
            snprintf(extra, sizeof(extra), ",\"spike_step\":%d,\"recovery_steps\":%d",
                     s->spike_step, n);
            runlog_event(t, step, "spike", msg, extra);
            s->in_spike = 0;
        }
    } else if (s->n >= SPIKE_MIN_SAMPLES) {
        fp8t_spike_verdict v = fp8t_spike_check(&s->cfg, s->hist, s->n, loss);
        if (v.is_spike) {
            s->in_spike = 1;
            s->spike_step = step;
            s->recover_below = v.median + SPIKE_RECOVER_SIGMAS * v.sigma;
            snprintf(msg, sizeof(msg),
                     "loss spike: %.4f is %.1f robust sigmas above the level "
                     "%.4f expected from the last %d steps",
                     loss, v.zscore, v.median, s->n);
            snprintf(extra, sizeof(extra), ",\"loss\":%.9g,\"zscore\":%.4g,\"median\":%.9g", loss,
                     v.zscore, v.median);
            runlog_event(t, step, "spike", msg, extra);
        }
    }
    spike_push(s, loss);
}

/* ---------------------------------------------------------------- drift */

#define DRIFT_WINDOW 10

int drift_load(drift_state *d, const char *baseline, int first_step, char *err, size_t errlen) {
    memset(d, 0, sizeof(*d));
    d->window = DRIFT_WINDOW;
    d->first_step = first_step;
    char path[FP8T_TRAIN_PATH_BUF];
    struct stat st;
    if (stat(baseline, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (fp8t_fmt(path, sizeof(path), "%s/metrics.jsonl", baseline) != 0) {
            return fp8t_errorf(err, errlen, "--baseline path too long");
        }
    } else {
        snprintf(path, sizeof(path), "%s", baseline);
    }
    fp8t_metric_row *rows = NULL;
    int n = 0;
    char e[FP8T_ERR_LEN];
    if (fp8t_metrics_read(&rows, &n, path, e, sizeof(e)) != 0) {
        return fp8t_errorf(err, errlen, "--baseline: %s (pass the directory of a finished run)",
                           e);
    }
    d->base_step = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    d->base_loss = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (int i = 0; i < n; i++) {
        if (!rows[i].has_loss) continue;
        d->base_step[d->n_base] = rows[i].step;
        d->base_loss[d->n_base] = rows[i].loss;
        d->n_base++;
    }
    free(rows);
    if (d->n_base == 0) {
        fp8t_errorf(err, errlen, "--baseline %s: no training losses in it", path);
        drift_free(d);
        return -1;
    }
    return 0;
}

void drift_free(drift_state *d) {
    free(d->base_step);
    free(d->base_loss);
    free(d->a);
    free(d->b);
    memset(d, 0, sizeof(*d));
}

static int find_step(const drift_state *d, int step) {
    int lo = 0, hi = d->n_base - 1; /* rows are sorted by step */
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (d->base_step[mid] == step) return mid;
        if (d->base_step[mid] < step)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

double drift_observe(trainer *t, int step, double loss) {
    drift_state *d = &t->drift;
    if (!d->base_step) return NAN;
    int i = find_step(d, step);
    if (i < 0 || !isfinite(d->base_loss[i]) || !isfinite(loss)) return NAN;
    if (d->n == d->cap) {
        int cap = d->cap ? 2 * d->cap : 256;
        double *a = realloc(d->a, (size_t)cap * sizeof(double));
        if (a) d->a = a;
        double *b = a ? realloc(d->b, (size_t)cap * sizeof(double)) : NULL;
        if (b) d->b = b;
        if (!a || !b) return NAN; /* out of memory: no drift judgement, the run goes on */
        d->cap = cap;
    }
    d->a[d->n] = d->base_loss[i];
    d->b[d->n] = loss;
    d->n++;
    if (d->n < d->window) return NAN; /* too few steps to smooth */
    double gap = fp8t_drift_gap(d->a, d->b, d->n, d->window);
    double thr = t->cfg.drift_threshold;
    char msg[400], extra[96];
    snprintf(extra, sizeof(extra), ",\"gap\":%.6g,\"threshold\":%.6g", gap, thr);
    if (!d->above && fabs(gap) > thr) {
        d->above = 1;
        /* the seeds' rule of thumb: a gap from the first steps is a software bug, a gap that
         * grows late is a recipe that does not suit the data or the model */
        int early = step - d->first_step <= (t->cfg.steps - d->first_step) / 10 + d->window;
        snprintf(msg, sizeof(msg),
                 "loss drifts %+.2f%% from the baseline (smoothed over %d steps, "
                 "threshold %.2f%%): %s",
                 100 * gap, d->window, 100 * thr,
                 early ? "early, which usually means a software bug (scales, formats, a wrong "
                         "transpose); check with --precision fake and fp8train bisect"
                       : "late, which usually means the recipe does not suit the data/model; "
                         "try fp8train bisect, current scaling or BF16 for the culprit");
        runlog_event(t, step, "drift", msg, extra);
    } else if (d->above && fabs(gap) <= thr) {
        d->above = 0;
        snprintf(msg, sizeof(msg), "loss back within %.2f%% of the baseline (gap %+.2f%%)",
                 100 * thr, 100 * gap);
        runlog_event(t, step, "drift", msg, extra);
    }
    return gap;
}
