/* Detectors over metric series: robust z-score spikes, spike recovery, drift against a
 * baseline. Robust statistics (median, MAD) so one spike does not hide the next one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/compare.h"
#include "fp8train/debug.h"
#include "util/check.h"

/* Samples needed before a judgement: fewer say nothing about the spread. */
#define SPIKE_MIN_HISTORY 5

static int cmp_double(const void *pa, const void *pb) {
    double a = *(const double *)pa, b = *(const double *)pb;
    return (a > b) - (a < b);
}

/* The detectors' scratch is a window of doubles; running out of memory there is not
 * recoverable in any useful way, so say where and stop (as the CPU backend does). */
#define DETECT_ALLOC(count) detect_alloc((size_t)(count), __FILE__, __LINE__)
static double *detect_alloc(size_t count, const char *file, int line) {
    double *p = malloc(sizeof(double) * (count ? count : 1));
    if (!p) {
        fp8t_fatal(file, line, "out of memory allocating %zu doubles", count);
    }
    return p;
}

double fp8t_median_inplace(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return (n & 1) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double fp8t_robust_sigma(const double *x, int n, double *median) {
    double *v = DETECT_ALLOC(n > 0 ? n : 1); /* [n] finite samples */
    int m = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i])) v[m++] = x[i];
    if (m == 0) {
        free(v);
        if (median) *median = NAN;
        return NAN;
    }
    double med = fp8t_median_inplace(v, m);
    double mean_ad = 0;
    for (int i = 0; i < m; i++) {
        v[i] = fabs(v[i] - med);
        mean_ad += v[i];
    }
    mean_ad /= m;
    double mad = fp8t_median_inplace(v, m);
    free(v);
    if (median) *median = med;
    /* 1.4826 MAD estimates sigma of a normal; when more than half the samples equal the
     * median MAD is 0 and 1.2533 * mean absolute deviation takes over (same normalization);
     * a constant series gets a tiny floor so a jump still counts as one. */
    if (mad > 0) return 1.4826 * mad;
    if (mean_ad > 0) return 1.2533 * mean_ad;
    double fl = 1e-6 * fabs(med);
    return fl > 1e-12 ? fl : 1e-12;
}

/* The level a new sample (at position w, just after the window h[0..w-1]) is expected at, and
 * the spread of its distance from there, judged on the step-to-step changes. Without that, the
 * first steps of a run, where the loss falls fast, look like noise: a window over 5.6 -> 3.5
 * has a median near 4.6 and a robust sigma near 0.7, so a jump 3.49 -> 8.11 scores a z of only
 * ~5 (issue 13). The expected level is the last sample plus the median step-to-step change (the
 * local trend; a linear fit over the whole window would lag behind the curvature of a loss that
 * falls ever slower), and sigma is the robust spread of those changes: for noise around a smooth
 * trend, x minus the last sample has exactly the spread of the changes, so z keeps its meaning.
 * Returns 0 when fewer than 4 changes are known. */
static int diff_level(const double *h, int w, double *level, double *sigma) {
    double *d = DETECT_ALLOC(w); /* [w] changes per step between consecutive finite samples */
    int m = 0, last = -1;
    for (int i = 0; i < w; i++) {
        if (!isfinite(h[i])) continue;
        if (last >= 0) d[m++] = (h[i] - h[last]) / (i - last);
        last = i;
    }
    if (m < 4) {
        free(d);
        return 0;
    }
    double dmed;
    *sigma = fp8t_robust_sigma(d, m, &dmed);
    /* A falling loss may stop falling at any step (a plateau, a schedule change): that moves a
     * sample by one trend step from the prediction, and is no spike. So the spread is at least
     * the trend's step; a few steadily falling samples would otherwise give a tiny sigma. */
    if (*sigma < fabs(dmed)) *sigma = fabs(dmed);
    *level = h[last] + dmed * (w - last);
    free(d);
    return 1;
}

fp8t_spike_verdict fp8t_spike_check(const fp8t_spike_cfg *cfg, const double *hist, int n,
                                    double x) {
    fp8t_spike_verdict v = {0, 0.0, NAN, NAN};
    int w = (cfg && cfg->window > 0 && cfg->window < n) ? cfg->window : n;
    double zthr = (cfg && cfg->z > 0) ? cfg->z : 6.0;
    if (n <= 0 || !hist) return v;
    const double *h = hist + (n - w); /* the last w samples */
    int finite = 0;
    for (int i = 0; i < w; i++) finite += isfinite(h[i]) != 0;
    /* A non-finite sample is the NaN detector's business, not a spike. */
    if (finite == 0 || !isfinite(x)) {
        v.zscore = NAN;
        return v;
    }
    /* The step-to-step view takes over only where a trend dominates the window (the spread
     * of the changes, over sqrt(2), under half the window's own spread): on a flat noisy
     * series the window median is the steadier level. */
    double med, sigma = fp8t_robust_sigma(h, w, &med), dl, ds;
    v.median = med;
    v.sigma = sigma;
    if (diff_level(h, w, &dl, &ds) && ds / sqrt(2.0) < 0.5 * sigma) v.median = dl, v.sigma = ds;
    v.zscore = (x - v.median) / v.sigma;
    /* One-sided: losses and gradient norms spike upward; a sudden drop is not an alarm. */
    v.is_spike = finite >= SPIKE_MIN_HISTORY && v.zscore > zthr;
    return v;
}

int fp8t_spike_recovery(const double *x, int n, int at, int window, double k) {
    if (at < 0 || at >= n) return -1;
    int lo = window > 0 ? at - window : 0;
    if (lo < 0) lo = 0;
    if (at - lo <= 0) return -1;
    double med;
    double sigma = fp8t_robust_sigma(x + lo, at - lo, &med);
    if (!isfinite(med)) return -1;
    double limit = med + k * sigma;
    for (int j = at + 1; j < n; j++)
        if (isfinite(x[j]) && x[j] <= limit) return j - at;
    return -1;
}

int fp8t_spike_scan(fp8t_spike_event *out, int max, const double *x, int n,
                    const fp8t_spike_cfg *cfg, double min_rel, double k_recover) {
    int window = cfg && cfg->window > 0 ? cfg->window : 50;
    int found = 0;
    for (int i = SPIKE_MIN_HISTORY; i < n; i++) {
        int lo = i - window < 0 ? 0 : i - window;
        fp8t_spike_verdict v = fp8t_spike_check(cfg, x + lo, i - lo, x[i]);
        if (!v.is_spike) continue;
        if (!(x[i] - v.median > min_rel * fabs(v.median))) continue;
        int rec = fp8t_spike_recovery(x, n, i, window, k_recover);
        int end = rec < 0 ? n : i + rec; /* first recovered sample (exclusive end) */
        int peak = i;
        for (int j = i; j < end; j++)
            if (isfinite(x[j]) && x[j] > x[peak]) peak = j;
        if (found < max && out) {
            fp8t_spike_event *e = &out[found];
            e->index = i;
            e->peak_index = peak;
            e->zscore = v.zscore;
            e->median = v.median;
            e->size_rel = (x[peak] - v.median) / fabs(v.median);
            e->recovery = rec;
        }
        found++;
        if (rec < 0) break; /* never came back: the rest of the series is one excursion */
        i = end;            /* continue after the recovered sample */
    }
    return found;
}

static double rel_gap(double base, double test) {
    if (!isfinite(base) || !isfinite(test) || base == 0) return NAN;
    return (test - base) / fabs(base);
}

int fp8t_drift_detect(double *smoothed, const double *base, const double *test, int n, int window,
                      double threshold) {
    if (window < 1) window = 1;
    double *g = DETECT_ALLOC(n > 0 ? n : 1); /* [n] relative gaps */
    double *w = DETECT_ALLOC(window);        /* [window] scratch */
    for (int i = 0; i < n; i++) g[i] = rel_gap(base[i], test[i]);
    int first = -1;
    double prev = 0;
    /* Trailing median over the last `window` samples: a drift moves it, a one-step spike
     * does not (a mean would turn every spike into a window-long plateau). Non-finite gaps
     * are skipped; with none left the previous value carries on. */
    for (int i = 0; i < n; i++) {
        int m = 0;
        for (int j = i - window + 1 < 0 ? 0 : i - window + 1; j <= i; j++)
            if (isfinite(g[j])) w[m++] = g[j];
        double s = m ? fp8t_median_inplace(w, m) : prev;
        prev = s;
        if (smoothed) smoothed[i] = s;
        if (first < 0 && fabs(s) > threshold) first = i;
    }
    free(w);
    free(g);
    return first;
}

double fp8t_drift_gap(const double *base, const double *test, int n, int window) {
    if (window < 1) window = 1;
    double *w = DETECT_ALLOC(window); /* [window] */
    int cnt = 0;
    for (int i = n - 1; i >= 0 && cnt < window; i--) {
        double g = rel_gap(base[i], test[i]);
        if (isfinite(g)) w[cnt++] = g;
    }
    double s = cnt ? fp8t_median_inplace(w, cnt) : 0.0;
    free(w);
    return s;
}
