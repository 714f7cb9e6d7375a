/* compare: align two runs' losses by step, measure the gap, find spikes and NaNs, and classify
 * it (the seeds' problem classes). The tensor tables are in compare_tensors.c, the text and
 * JSON output in compare_print.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/compare.h"
#include "fp8train/error.h"
#include "tools/compare_internal.h"

#define MAX_SPIKES 64

void fp8t_compare_cfg_default(fp8t_compare_cfg *cfg) {
    cfg->threshold = 0.01;
    cfg->window = 0;
    cfg->spike_window = 50;
    cfg->spike_z = 6.0;
    cfg->recover_k = 3.0;
    cfg->slow_recovery = 0;
    cfg->cosine_flag = 0.99;
    cfg->noise_run = NULL;
}

const char *fp8t_compare_class_name(fp8t_compare_class c) {
    static const char *names[FP8T_CMP_COUNT] = {"match", "spike", "drift", "early-divergence",
                                                "nan"};
    return (c >= 0 && c < FP8T_CMP_COUNT) ? names[c] : "?";
}

void compare_add_note(fp8t_compare_result *r, const char *fmt, const char *a, const char *b) {
    if (r->n_notes >= (int)(sizeof(r->notes) / sizeof(r->notes[0]))) return;
    snprintf(r->notes[r->n_notes++], sizeof(r->notes[0]), fmt, a, b);
}

/* ---- loss alignment and gap statistics ---- */

static int align_losses(fp8t_compare_result *r, const fp8t_run *a, const fp8t_run *b) {
    int cap = a->n_metrics < b->n_metrics ? a->n_metrics : b->n_metrics;
    r->steps = malloc(sizeof(int) * (size_t)(cap + 1));
    r->loss_a = malloc(sizeof(double) * (size_t)(cap + 1));
    r->loss_b = malloc(sizeof(double) * (size_t)(cap + 1));
    if (!r->steps || !r->loss_a || !r->loss_b) return -1;
    int i = 0, j = 0, n = 0;
    while (i < a->n_metrics && j < b->n_metrics) {
        const fp8t_metric_row *x = &a->metrics[i], *y = &b->metrics[j];
        if (!x->has_loss) {
            i++;
            continue;
        }
        if (!y->has_loss) {
            j++;
            continue;
        }
        if (x->step < y->step) {
            i++;
            continue;
        }
        if (y->step < x->step) {
            j++;
            continue;
        }
        r->steps[n] = x->step;
        r->loss_a[n] = x->loss;
        r->loss_b[n] = y->loss;
        n++;
        i++;
        j++;
    }
    r->n = n;
    return 0;
}

static void step_range(const fp8t_run *run, int *lo, int *hi) {
    *lo = -1;
    *hi = -1;
    for (int i = 0; i < run->n_metrics; i++) {
        if (!run->metrics[i].has_loss) continue;
        if (*lo < 0) *lo = run->metrics[i].step;
        *hi = run->metrics[i].step;
    }
}

static void gap_stats(fp8t_compare_result *r) {
    int n = r->n;
    r->gap = malloc(sizeof(double) * (size_t)n);
    r->gap_smooth = malloc(sizeof(double) * (size_t)n);
    double sum = 0;
    int cnt = 0;
    r->max_gap_step = -1;
    for (int i = 0; i < n; i++) {
        double a = r->loss_a[i], b = r->loss_b[i];
        r->gap[i] = (isfinite(a) && isfinite(b) && a != 0) ? (b - a) / fabs(a) : NAN;
        if (!isfinite(r->gap[i])) continue;
        double g = fabs(r->gap[i]);
        sum += g;
        cnt++;
        if (g > r->max_abs_gap || r->max_gap_step < 0) {
            r->max_abs_gap = g;
            r->max_gap_step = r->steps[i];
        }
    }
    r->mean_abs_gap = cnt ? sum / cnt : NAN;
    fp8t_drift_detect(r->gap_smooth, r->loss_a, r->loss_b, n, r->window, r->threshold);
    r->late_gap = n ? r->gap_smooth[n - 1] : NAN;
    /* From which step the smoothed gap stays above the threshold to the end. */
    r->drift_step = -1;
    for (int i = n - 1; i >= 0 && fabs(r->gap_smooth[i]) > r->threshold; i--)
        r->drift_step = r->steps[i];

    /* early gap: median |gap| over the first 10% (at least 3 samples) */
    int k = n / 10;
    if (k < 3) k = n < 3 ? n : 3;
    double *tmp = malloc(sizeof(double) * (size_t)(k > 0 ? k : 1));
    int m = 0;
    for (int i = 0; i < k; i++)
        if (isfinite(r->gap[i])) tmp[m++] = fabs(r->gap[i]);
    r->early_gap = m ? fp8t_median_inplace(tmp, m) : NAN;
    free(tmp);

    /* trend: least-squares slope of |gap| against the step, over the second half */
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int c = 0;
    for (int i = n / 2; i < n; i++) {
        if (!isfinite(r->gap[i])) continue;
        double x = r->steps[i], y = fabs(r->gap[i]);
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
        c++;
    }
    double den = c * sxx - sx * sx;
    r->trend = (c >= 2 && den > 0) ? (c * sxy - sx * sy) / den : 0.0;

    double *res = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1)); /* [n] gap - smoothed */
    for (int i = 0; i < n; i++) res[i] = r->gap[i] - r->gap_smooth[i];
    r->gap_noise = fp8t_robust_sigma(res, n, NULL);
    free(res);
}

/* (b - a) / |a| of the validation loss at the last step where both have one; NaN (step -1)
 * when they share none */
static double last_val_gap(const fp8t_run *a, const fp8t_run *b, int *step) {
    *step = -1;
    for (int i = a->n_metrics - 1; i >= 0; i--) {
        const fp8t_metric_row *x = &a->metrics[i];
        if (!isfinite(x->val_loss) || x->val_loss == 0) continue;
        const fp8t_metric_row *y = fp8t_run_metric_at(b, x->step);
        if (!y || !isfinite(y->val_loss)) continue;
        *step = x->step;
        return (y->val_loss - x->val_loss) / fabs(x->val_loss);
    }
    return NAN;
}


/* ---- noise ----
 * How far apart the end gap of two runs that are equally good may land. Measured: the noise
 * run (a second baseline, e.g. BF16 with another seed) against A, smoothed like the gap, its
 * largest magnitude over the second half of their common steps (the first half holds the
 * different initialisation, not the noise of the end). Estimated, without one: twice the
 * per-step spread of the gap around its smoothed value. Two runs that differ only by rounding
 * end up as far apart as their per-step losses on the same batches wander; in make demo's
 * tiny runs (600 steps) that spread is 1.8%, and a second BF16 seed ends 4% apart in training
 * loss (7% in validation loss), so the factor 2 is an estimate, not a bound: pass a noise run
 * to measure. */
static int measure_noise(fp8t_compare_result *r, const fp8t_run *a, const fp8t_run *noise,
                         char *err, size_t errlen) {
    r->noise_val_gap = NAN;
    if (!noise) {
        r->noise = isfinite(r->gap_noise) ? 2 * r->gap_noise : 0;
        return 0;
    }
    fp8t_compare_result nr;
    memset(&nr, 0, sizeof(nr));
    if (align_losses(&nr, a, noise)) {
        fp8t_compare_result_free(&nr);
        return fp8t_errorf(err, errlen, "out of memory");
    }
    if (nr.n < 2) {
        fp8t_errorf(err, errlen,
                    "--noise-run %s shares %d step%s with a loss with run A %s: give it "
                    "the same --steps as the baseline",
                    noise->metrics_path, nr.n, nr.n == 1 ? "" : "s", a->metrics_path);
        fp8t_compare_result_free(&nr);
        return -1;
    }
    double *s = malloc(sizeof(double) * (size_t)nr.n); /* [n] smoothed gap of the noise run */
    if (!s) {
        fp8t_compare_result_free(&nr);
        return fp8t_errorf(err, errlen, "out of memory");
    }
    fp8t_drift_detect(s, nr.loss_a, nr.loss_b, nr.n, r->window, r->threshold);
    double m = 0;
    for (int i = nr.n / 2; i < nr.n; i++)
        if (isfinite(s[i]) && fabs(s[i]) > m) m = fabs(s[i]);
    free(s);
    r->noise = m;
    r->noise_from_run = 1;
    snprintf(r->noise_label, sizeof(r->noise_label), "%s", noise->label);
    int step;
    r->noise_val_gap = last_val_gap(a, noise, &step);
    fp8t_compare_result_free(&nr);
    return 0;
}

/* ---- NaN ---- */

/* First step of run with a non-finite loss or a "nan" event; -1 if none. */
static int first_nan(const fp8t_run *run, char *where, size_t len) {
    int step = -1;
    where[0] = 0;
    for (int i = 0; i < run->n_metrics; i++)
        if (run->metrics[i].has_loss && !isfinite(run->metrics[i].loss)) {
            step = run->metrics[i].step;
            snprintf(where, len, "non-finite loss");
            break;
        }
    for (int i = 0; i < run->n_events; i++) {
        const fp8t_event_row *e = &run->events[i];
        if (strcmp(e->kind, "nan") != 0 && strcmp(e->kind, "inf") != 0) continue;
        if (step < 0 || (e->step >= 0 && e->step <= step)) {
            step = e->step;
            snprintf(where, len, "%s", e->message[0] ? e->message : "NaN event");
        }
        break;
    }
    return step;
}

/* ---- spikes ----
 * A spike is a jump of one run's own loss (robust z-score over its own window, and larger
 * than the threshold relative to the window median). How long it takes to recover is
 * measured on the ratio loss_run / loss_other: it has no training trend (in a falling raw
 * loss the window median lags above the current level and hides how slowly a spike decays),
 * and "back to the other run" is what the seeds mean by recovered. A spike the other run
 * has too (within 2 steps) is the data's, not FP8's. */

static void spike_cfg(fp8t_spike_cfg *sc, const fp8t_compare_cfg *cfg, int n) {
    int w = cfg->spike_window > 0 ? cfg->spike_window : 50;
    if (w > n / 4) w = n / 4;
    if (w < 5) w = 5;
    sc->window = w;
    sc->z = cfg->spike_z > 0 ? cfg->spike_z : 6.0;
}

static void find_spikes(fp8t_compare_result *r, const fp8t_compare_cfg *cfg) {
    int n = r->n;
    fp8t_spike_cfg sc;
    spike_cfg(&sc, cfg, n);
    fp8t_spike_event raw[2][MAX_SPIKES];
    int nraw[2];
    const double *x[2] = {r->loss_a, r->loss_b};
    for (int k = 0; k < 2; k++) {
        nraw[k] = fp8t_spike_scan(raw[k], MAX_SPIKES, x[k], n, &sc, r->threshold, cfg->recover_k);
        if (nraw[k] > MAX_SPIKES) nraw[k] = MAX_SPIKES;
    }
    r->spikes = calloc((size_t)(nraw[0] + nraw[1] + 1), sizeof(fp8t_spike_report));
    double *ratio = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1)); /* [n] */
    if (!r->spikes || !ratio) {
        free(ratio);
        return;
    }
    for (int k = 0; k < 2; k++) {
        const double *num = x[k], *den = x[1 - k];
        for (int i = 0; i < n; i++)
            ratio[i] =
                (isfinite(num[i]) && isfinite(den[i]) && den[i] != 0) ? num[i] / den[i] : NAN;
        for (int e = 0; e < nraw[k]; e++) {
            const fp8t_spike_event *v = &raw[k][e];
            fp8t_spike_report *s = &r->spikes[r->n_spikes++];
            s->step = r->steps[v->index];
            s->run = k;
            s->size_rel = v->size_rel;
            s->zscore = v->zscore;
            for (int o = 0; o < nraw[1 - k]; o++)
                if (abs(r->steps[raw[1 - k][o].index] - s->step) <= 2) s->in_other_run = 1;
            int rec = fp8t_spike_recovery(ratio, n, v->index, sc.window, cfg->recover_k);
            s->recovery_steps = rec < 0 ? -1 : r->steps[v->index + rec] - r->steps[v->index];
            s->slow = s->recovery_steps < 0 || s->recovery_steps > r->slow_recovery;
        }
    }
    free(ratio);
}

/* ---- classification ---- */

static void fmt_pct(char *buf, size_t len, double x) {
    if (!isfinite(x))
        snprintf(buf, len, "n/a");
    else
        snprintf(buf, len, "%+.2f%%", 100.0 * x);
}

static void classify(fp8t_compare_result *r, const fp8t_run *a, const fp8t_run *b) {
    const fp8t_run *runs[2] = {a, b};
    char thr[32];
    snprintf(thr, sizeof(thr), "%.3g%%", 100.0 * r->threshold);
    if (r->nan_run >= 0) {
        r->cls = FP8T_CMP_NAN;
        snprintf(r->verdict, sizeof(r->verdict),
                 "NaN: run %c (%s) went non-finite at step %d: %s", 'A' + r->nan_run,
                 runs[r->nan_run]->label, r->nan_step, r->nan_where);
        snprintf(r->advice, sizeof(r->advice),
                 "resume the last good checkpoint before step %d with --inspect "
                 "'start=%d,tensors=all' to see the amax/scale of the named tensor; put its GEMM "
                 "in bf16 (--override 'layers=L,module=M,gemm=G,precision=bf16') or current "
                 "scaling (precision=current) to confirm",
                 r->nan_step, r->nan_step > 0 ? r->nan_step - 1 : 0);
        return;
    }
    /* A gap present from the start that shrinks to under half by the end is closing, not a
     * bug: a recovery experiment that works (an FP8 checkpoint resumed in BF16) reads so. */
    int early = isfinite(r->early_gap) && r->early_gap > r->threshold;
    int closes = early && isfinite(r->late_gap) && fabs(r->late_gap) < 0.5 * r->early_gap;
    char eg[32], lg[32];
    fmt_pct(eg, sizeof(eg), r->early_gap);
    fmt_pct(lg, sizeof(lg), r->late_gap);
    /* The end gap is judged against the noise as well as the threshold (measure_noise), and
     * only a B that ends worse than A can drift: FP8 ending below BF16 is no recipe problem. */
    const double bar = r->noise > r->threshold ? r->noise : r->threshold;
    int in_noise = 0;
    char nz[160];
    if (r->noise_from_run)
        snprintf(nz, sizeof(nz), "+-%.2f%%, measured with the noise run %.60s", 100 * r->noise,
                 r->noise_label);
    else
        snprintf(nz, sizeof(nz), "+-%.2f%%, estimated from the runs' step-to-step spread",
                 100 * r->noise);
    int a_lo, a_hi, b_lo, b_hi;
    step_range(a, &a_lo, &a_hi);
    step_range(b, &b_lo, &b_hi);
    if (early && !closes && b_lo > a_lo + 1) {
        /* B begins mid-run: resumed from a checkpoint */
        r->cls = FP8T_CMP_EARLY;
        snprintf(r->verdict, sizeof(r->verdict),
                 "early divergence: run B starts at step %d (resumed) already %s off the "
                 "baseline and the gap does not close (%s at the end, threshold %s)",
                 b_lo, eg + 1, lg, thr);
        snprintf(r->advice, sizeof(r->advice),
                 "if B is a recovery experiment (an FP8 checkpoint resumed in BF16), its weights "
                 "are damaged beyond quick repair: repeat it from an earlier checkpoint; if B "
                 "just switched to FP8 there, suspect a software bug (check the restored scales "
                 "and amax history, try --reset-fp8)");
        return;
    }
    if (early && !closes) {
        char g[32];
        fmt_pct(g, sizeof(g), r->early_gap);
        r->cls = FP8T_CMP_EARLY;
        snprintf(r->verdict, sizeof(r->verdict),
                 "early divergence: the gap is already %s (median |gap|) over the first 10%% of "
                 "steps (threshold %s): likely a software bug, not the FP8 recipe",
                 g + 1, thr);
        snprintf(
            r->advice, sizeof(r->advice),
            "turn off recently added or risky features (fused and cached paths), check that "
            "both runs start from the same weights, data and seed, and check scales and "
            "export; then bisect the GEMMs (fp8train bisect). One recipe effect looks alike: "
            "delayed scaling runs its first step with scale 1 (no amax recorded yet); if a "
            "--recipe current run stays under the threshold early, that cold start, not a "
            "bug, is the likely cause");
        return;
    }
    if (closes && r->late_gap > bar) {
        r->cls = FP8T_CMP_DRIFT;
        snprintf(r->verdict, sizeof(r->verdict),
                 "drift: the gap closes, from %s over the first 10%% of steps to %s at the end, "
                 "but stays above the threshold %s and the noise (%s)",
                 eg + 1, lg, thr, nz);
        snprintf(r->advice, sizeof(r->advice),
                 "run longer to see whether it closes; if B is a recovery experiment (an FP8 "
                 "checkpoint resumed in BF16), a gap that closes means the FP8 recipe, not the "
                 "weights, caused it: bisect the GEMMs next (fp8train bisect)");
        return;
    }
    if (closes) {
        char note[160];
        snprintf(note, sizeof(note), "%s over the first 10%% of steps, %s at the end", eg + 1,
                 lg);
        compare_add_note(
            r, "the gap closes: %s (a recovery experiment that works looks like this)%s", note,
            "");
    }
    if (isfinite(r->late_gap) && r->late_gap < -r->threshold) {
        char g[32];
        fmt_pct(g, sizeof(g), r->late_gap);
        compare_add_note(r,
                         "run B ends BELOW the baseline (%s): it is not worse, so this is no "
                         "recipe problem%s",
                         g,
                         fabs(r->late_gap) > bar ? " (beyond the noise: check that "
                                                   "both runs saw the same data and steps)"
                                                 : ", and inside the noise");
    } else if (isfinite(r->late_gap) && r->late_gap > r->threshold && r->late_gap <= bar) {
        char g[32];
        fmt_pct(g, sizeof(g), r->late_gap);
        compare_add_note(r,
                         "the end gap %s is above the threshold but inside the noise "
                         "(%.120s): a match",
                         g, nz);
        in_noise = 1;
    }
    /* Where the smoothed gap first left the threshold right after a spike of B's own (none in
     * A), the runs parted at that spike: README's FP8 example jumps 3.49 -> 8.24 at step 19,
     * the gap leaves 1% some 20 steps later and B ends 4.6% above BF16. "drift: the recipe
     * does not suit" would hide the event that started it. A spike long before the gap first
     * left (more than two smoothing windows) is a separate event, and the late gap a drift. */
    int first_exit = -1;
    for (int i = 0; i < r->n && first_exit < 0; i++)
        if (fabs(r->gap_smooth[i]) > r->threshold) first_exit = r->steps[i];
    const fp8t_spike_report *parted = NULL;
    for (int i = 0; i < r->n_spikes && first_exit >= 0; i++) {
        const fp8t_spike_report *s = &r->spikes[i];
        if (s->run == 1 && !s->in_other_run && s->step <= first_exit &&
            first_exit - s->step <= 2 * r->window && (!parted || s->step < parted->step))
            parted = s;
    }
    const fp8t_spike_report *first_own = parted;
    if (isfinite(r->late_gap) && r->late_gap > bar && first_own) {
        char g[32], rec[64];
        fmt_pct(g, sizeof(g), r->late_gap);
        if (first_own->recovery_steps < 0)
            snprintf(rec, sizeof(rec), "never comes back");
        else
            snprintf(rec, sizeof(rec), "comes back in %d steps", first_own->recovery_steps);
        r->cls = FP8T_CMP_SPIKE;
        snprintf(
            r->verdict, sizeof(r->verdict),
            "spike, then a lasting gap: run B (%s) jumps %+.1f%% at step %d (robust z %.1f; "
            "the baseline does not) and %s, but the runs part there: the smoothed gap leaves "
            "the threshold %s at step %d and ends at %s (noise %.100s)",
            runs[1]->label, 100.0 * first_own->size_rel, first_own->step, first_own->zscore, rec,
            thr, first_exit, g, nz);
        snprintf(
            r->advice, sizeof(r->advice),
            "the spike is FP8's (BF16 has none there): inspect its steps (--inspect "
            "'start=%d,end=%d,tensors=operands') for an amax/scale jump, e.g. delayed scaling "
            "still on its first amaxes; try --recipe current or a shorter --amax-history; "
            "if the gap persists without the spike, bisect it as drift (fp8train bisect)",
            first_own->step > 2 ? first_own->step - 2 : 1, first_own->step + 1);
        return;
    }
    if (isfinite(r->late_gap) && r->late_gap > bar) {
        char g[32];
        fmt_pct(g, sizeof(g), r->late_gap);
        r->cls = FP8T_CMP_DRIFT;
        snprintf(
            r->verdict, sizeof(r->verdict),
            "drift: the smoothed gap ends at %s (threshold %s, noise %s), above the threshold "
            "since step %d, trend %+.2e/step: the FP8 recipe does not suit this data/model",
            g, thr, nz, r->drift_step, r->trend);
        snprintf(r->advice, sizeof(r->advice),
                 "recovery experiment: resume run B's last checkpoint with --precision bf16 "
                 "(loss should return to the baseline); then --precision fake; then one GEMM "
                 "kind in bf16 at a time (--override 'gemm=dgrad,precision=bf16', fprop, wgrad); "
                 "narrow to layers; try precision=current for the culprit (fp8train bisect "
                 "automates this)");
        return;
    }
    /* spikes not shared by the other run */
    const fp8t_spike_report *big = NULL;
    int n_own = 0, n_shared = 0;
    for (int i = 0; i < r->n_spikes; i++) {
        const fp8t_spike_report *s = &r->spikes[i];
        if (s->in_other_run && !s->slow) {
            n_shared++;
            continue;
        }
        n_own++;
        if (!big || s->slow > big->slow || (s->slow == big->slow && s->size_rel > big->size_rel))
            big = s;
    }
    if (n_shared) {
        char k[16];
        snprintf(k, sizeof(k), "%d", n_shared);
        compare_add_note(
            r, "%s spike(s) appear in both runs at the same steps: the data, not FP8%s", k, "");
    }
    if (big) {
        char rec[96];
        if (big->recovery_steps < 0)
            snprintf(rec, sizeof(rec), "does not recover before the end");
        else
            snprintf(rec, sizeof(rec), "recovers in %d steps", big->recovery_steps);
        r->cls = FP8T_CMP_SPIKE;
        snprintf(r->verdict, sizeof(r->verdict),
                 "spike: run %c (%s) jumps %+.1f%% at step %d (robust z %.1f) and %s%s%s",
                 'A' + big->run, runs[big->run]->label, 100.0 * big->size_rel, big->step,
                 big->zscore, rec,
                 big->slow ? " (slow: the loss differs from the baseline in substance, which "
                             "points at FP8)"
                           : " (fast: spikes like this are usually not FP8's fault)",
                 n_own > 1 ? "; more spikes below" : "");
        snprintf(r->advice, sizeof(r->advice), "%s",
                 big->slow ? "treat it as drift: recovery experiment (resume under --precision "
                             "bf16), then bisect the GEMMs; inspect the steps around the spike "
                             "(--inspect 'start=S,end=E')"
                           : "compare with spikes of BF16 runs on the same data; if they look "
                             "alike, FP8 is not the cause");
        return;
    }
    /* A stretch where the smoothed gap left the threshold and came back without a loss
     * spike in either run is a wander of two chaotic trajectories, not one of the seeds'
     * classes: a note, not a verdict. */
    int first = -1, back = -1;
    for (int i = 0; i < r->n && !closes; i++) {
        if (first < 0 && fabs(r->gap_smooth[i]) > r->threshold)
            first = i;
        else if (first >= 0 && fabs(r->gap_smooth[i]) <= r->threshold) {
            back = i;
            break;
        }
    }
    if (first >= 0 && back >= 0) {
        char x[64];
        snprintf(x, sizeof(x), "from step %d to step %d", r->steps[first], r->steps[back]);
        compare_add_note(
            r, "the smoothed gap left the threshold %s and came back, with no loss spike%s", x,
            "");
    }
    char mg[32], xg[32];
    fmt_pct(mg, sizeof(mg), r->mean_abs_gap);
    fmt_pct(xg, sizeof(xg), r->max_abs_gap);
    r->cls = FP8T_CMP_MATCH;
    snprintf(r->verdict, sizeof(r->verdict),
             "match: mean |gap| %s, max %s at step %d, end %+.2f%% (threshold %s, noise %s)",
             mg + 1, xg + 1, r->max_gap_step, 100.0 * r->late_gap, thr, nz);
    snprintf(r->advice, sizeof(r->advice), "%s",
             in_noise ? "nothing to do at this noise; a drift smaller than the noise cannot be "
                        "told from it: run longer or with larger batches, or measure the noise "
                        "with --noise-run (a BF16 run with another --seed)"
                      : "nothing to do; if downstream evaluation still differs, check the export "
                        "and its scales first");
}

int fp8t_compare_runs(fp8t_compare_result *r, const fp8t_run *a, const fp8t_run *b,
                      const fp8t_compare_cfg *cfg_in, char *err, size_t errlen) {
    fp8t_compare_cfg cfg;
    if (cfg_in)
        cfg = *cfg_in;
    else
        fp8t_compare_cfg_default(&cfg);
    memset(r, 0, sizeof(*r));
    r->nan_run = -1;
    r->nan_step = -1;
    r->drift_step = -1;
    r->val_gap = NAN;
    if (!(cfg.threshold > 0 && cfg.threshold < 10)) {
        return fp8t_errorf(err, errlen,
                           "--threshold %g: expected a relative gap in (0, 10), e.g. 0.01",
                           cfg.threshold);
    }
    r->threshold = cfg.threshold;
    if (align_losses(r, a, b)) {
        return fp8t_errorf(err, errlen, "out of memory");
    }
    if (r->n == 0) {
        int alo, ahi, blo, bhi;
        step_range(a, &alo, &ahi);
        step_range(b, &blo, &bhi);
        fp8t_errorf(
            err, errlen,
            "%s (steps %d..%d) and %s (steps %d..%d) share no step with a loss: compare "
            "runs over the same steps (the same --steps, or resume from a common checkpoint)",
            a->metrics_path, alo, ahi, b->metrics_path, blo, bhi);
        fp8t_compare_result_free(r);
        return -1;
    }
    r->window = cfg.window > 0 ? cfg.window : r->n / 10;
    if (cfg.window <= 0) {
        if (r->window < 3) r->window = 3;
        if (r->window > 50) r->window = 50;
    }
    if (r->window > r->n) r->window = r->n;
    int span = r->steps[r->n - 1] - r->steps[0];
    r->slow_recovery =
        cfg.slow_recovery > 0 ? cfg.slow_recovery : (span / 10 > 10 ? span / 10 : 10);

    gap_stats(r);
    r->val_gap = last_val_gap(a, b, &r->val_step);
    char where[2][256];
    int ns[2] = {first_nan(a, where[0], sizeof(where[0])),
                 first_nan(b, where[1], sizeof(where[1]))};
    for (int k = 1; k >= 0; k--) /* B (the run under test) first */
        if (ns[k] >= 0 && r->nan_run < 0) {
            r->nan_run = k;
            r->nan_step = ns[k];
            snprintf(r->nan_where, sizeof(r->nan_where), "%.250s", where[k]);
        }
    if (ns[0] >= 0 && ns[1] >= 0)
        compare_add_note(r, "both runs went non-finite (baseline %s at its step too)%s", a->label,
                         "");
    if (measure_noise(r, a, cfg.noise_run, err, errlen)) {
        fp8t_compare_result_free(r);
        return -1;
    }
    find_spikes(r, &cfg);
    compare_stats(r, a, b);
    compare_dumps(r, a, b, &cfg);
    classify(r, a, b);
    int a_lo, a_hi, b_lo, b_hi;
    step_range(a, &a_lo, &a_hi);
    step_range(b, &b_lo, &b_hi);
    if (a_hi != b_hi) {
        char x[64], y[64];
        snprintf(x, sizeof(x), "A ends at step %d, B at %d", a_hi, b_hi);
        snprintf(y, sizeof(y), "%d", r->n);
        compare_add_note(
            r, "the runs have different lengths (%s); compared over their %s common steps", x, y);
    }
    return 0;
}

void fp8t_compare_result_free(fp8t_compare_result *r) {
    if (!r) return;
    free(r->steps);
    free(r->loss_a);
    free(r->loss_b);
    free(r->gap);
    free(r->gap_smooth);
    free(r->spikes);
    free(r->sites);
    free(r->dumps);
    r->steps = NULL;
    r->loss_a = r->loss_b = r->gap = r->gap_smooth = NULL;
    r->spikes = NULL;
    r->sites = NULL;
    r->dumps = NULL;
}

int fp8t_compare_exit_code(const fp8t_compare_result *r) {
    return r->cls == FP8T_CMP_MATCH ? 0 : 1;
}
