/* fp8train — reading a run's logs, detectors over metric series, comparing two runs, and the
 * HTML report of a comparison (`fp8train compare RUN_A RUN_B`).
 *
 * A run directory (fp8t_train_run's OUT) holds:
 *   metrics.jsonl  one object per step: {"step": 12, "loss": 3.91, ...}; "val_loss",
 *                  "lr", "grad_norm" are read when present. Rows without "loss" (validation-only
 *                  rows) are kept for val_loss. A non-finite loss may be written as null, a
 *                  string ("nan", "inf") or a bare nan/inf token: all read as non-finite.
 *   events.jsonl   optional, one detector event per line: {"step": 40, "kind": "nan",
 *                  "message": "layer 2 fc2 fprop output (forward)"}; kind is one of nan, spike,
 *                  drift, shadow, fallback (others are kept as they are). "type"/"event" are
 *                  accepted for "kind", "msg"/"detail" for "message".
 *   stats.jsonl    optional (--inspect), written by fp8t_inspector (see docs/debugging.md);
 *                  also looked for in RUN/inspect/.
 *   dumps/step_NNNNNN/<layer>.<module>.<gemm>.<tensor>.npy   optional tensor dumps.
 * Anywhere a run is named, a path to its metrics.jsonl is accepted too.
 *
 * Run A is the baseline (e.g. BF16) and run B the run under test (e.g. FP8): the relative gap
 * is gap = (loss_B - loss_A) / |loss_A|, positive when B is worse. */
#ifndef FP8TRAIN_COMPARE_H
#define FP8TRAIN_COMPARE_H

#include <stddef.h>
#include <stdio.h>

#include "fp8train/debug.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FP8T_RUN_PATH 1024

/* ---- run logs ---- */
typedef struct {
    int step;
    int has_loss;         /* the row carries a training loss (finite or not) */
    double loss;          /* NaN when non-finite or absent */
    double val_loss;      /* NaN if absent */
    double lr, grad_norm; /* NaN if absent */
} fp8t_metric_row;

typedef struct {
    int step;
    char kind[16]; /* nan | spike | drift | shadow | fallback | ... */
    char message[256];
} fp8t_event_row;

/* The what-if recipes stats.jsonl carries per operand (see docs/debugging.md), in order:
 * current_e4m3, current_e5m2, block128_e4m3, block128_e5m2, mxfp8. */
#define FP8T_WHATIF_COUNT 5
extern const char *const fp8t_whatif_names[FP8T_WHATIF_COUNT];

/* One row of stats.jsonl (the fields compare and the report use). */
typedef struct {
    int step, micro, layer; /* layer -1: the LM head */
    char module[8], gemm[8], tensor[16], precision[12];
    int is_operand; /* input / weight / grad_output (quantized operands) */
    double amax, underflow_pct, saturation_pct, cosine, sqnr_db, scale;
    double n_nan, n_inf;
    /* what-if recipes (NaN when the row has none): SQNR dB, underflow %, saturation % */
    double whatif_sqnr[FP8T_WHATIF_COUNT], whatif_under[FP8T_WHATIF_COUNT],
        whatif_sat[FP8T_WHATIF_COUNT];
    /* block / rowwise rows: the worst of the GEMM's own tiles (NaN when the row has none) */
    double tile_sqnr_min_db, tile_underflow_max_pct;
} fp8t_stat_row;

typedef struct {
    char dir[FP8T_RUN_PATH]; /* the run directory */
    char metrics_path[FP8T_RUN_PATH];
    char stats_path[FP8T_RUN_PATH]; /* "" if none */
    char dumps_dir[FP8T_RUN_PATH];  /* "" if none */
    char label[64];                 /* short name for tables and legends */
    fp8t_metric_row *metrics;
    int n_metrics; /* sorted by step, one row per step (last wins) */
    fp8t_event_row *events;
    int n_events;
    fp8t_stat_row *stats;
    int n_stats;
} fp8t_run;

/* Readers: 0 ok, -1 with err naming the file (and line) and the fix. A truncated last line
 * (a run killed mid-write) is skipped with a warning on stderr. *rows malloc'd. */
int fp8t_metrics_read(fp8t_metric_row **rows, int *n, const char *path, char *err, size_t errlen);
int fp8t_events_read(fp8t_event_row **rows, int *n, const char *path, char *err, size_t errlen);
int fp8t_stats_read(fp8t_stat_row **rows, int *n, const char *path, char *err, size_t errlen);
/* Load a run from a directory or a metrics.jsonl path: metrics (required), events, stats and
 * the dumps directory (optional). 0 ok, -1 with err. */
int fp8t_run_load(fp8t_run *run, const char *path, char *err, size_t errlen);
void fp8t_run_free(fp8t_run *run);
/* The metric row of `step`, or NULL. */
const fp8t_metric_row *fp8t_run_metric_at(const fp8t_run *run, int step);

/* ---- detectors over series (fp8t_spike_check is in debug.h) ---- */
/* Median of v[0..n-1], n > 0; sorts v in place. */
double fp8t_median_inplace(double *v, int n);

/* Robust spread of x[0..n-1] ignoring non-finite values: returns sigma = 1.4826 * MAD, or
 * when MAD is 0 the mean absolute deviation * 1.2533, or when that is 0 too a floor of
 * 1e-6 * |median| (at least 1e-12) so a constant history still judges a jump. *median gets the
 * median (NaN if no finite sample). */
double fp8t_robust_sigma(const double *x, int n, double *median);

/* Samples after index `at` until the series is back within median + k * sigma of the `window`
 * samples before `at` (fp8t_robust_sigma): returns the number of samples j - at of the first
 * such j > at, or -1 if it never comes back before the end of the series. */
int fp8t_spike_recovery(const double *x, int n, int at, int window, double k);

typedef struct {
    int index;       /* index of the first spiking sample */
    int peak_index;  /* index of the largest sample of the excursion */
    double zscore;   /* robust z of the first sample */
    double median;   /* of the window before the spike */
    double size_rel; /* (peak - median) / |median| */
    int recovery;    /* samples from index until back within median + k sigma; -1 never */
} fp8t_spike_event;

/* Scan a series for upward spikes: sample i is a spike when fp8t_spike_check over the
 * previous cfg->window samples says so and it lies more than min_rel * |median| above the
 * median. Consecutive spiking samples are one event, which ends when the series recovers
 * (median + k_recover * sigma). Writes up to max events, returns how many were found. */
int fp8t_spike_scan(fp8t_spike_event *out, int max, const double *x, int n,
                    const fp8t_spike_cfg *cfg, double min_rel, double k_recover);

/* Drift of `test` against the aligned `base`: g[i] = (test[i] - base[i]) / |base[i]|,
 * smoothed[i] = median of the finite g over the last `window` samples ending at i (a median,
 * so a one-step spike does not read as drift; with no finite sample the previous value
 * carries on). smoothed (may be NULL) gets n values. Returns the first index where
 * |smoothed| > threshold, or -1. */
int fp8t_drift_detect(double *smoothed, const double *base, const double *test, int n, int window,
                      double threshold);
/* Online form: the smoothed relative gap at the end of the aligned series (the median of g
 * over the last `window` finite pairs; 0 if none). A trainer compares |value| with its
 * threshold. */
double fp8t_drift_gap(const double *base, const double *test, int n, int window);

/* ---- compare ---- */
typedef enum {
    FP8T_CMP_MATCH = 0, /* within threshold, no unexplained spike */
    FP8T_CMP_SPIKE,     /* transient excursion that recovers */
    FP8T_CMP_DRIFT,     /* gap grows late and stays: the recipe does not suit the data/model */
    FP8T_CMP_EARLY,     /* gap already in the first steps: likely a software bug */
    FP8T_CMP_NAN,       /* a run has a non-finite loss or a NaN event */
    FP8T_CMP_COUNT
} fp8t_compare_class;
const char *fp8t_compare_class_name(fp8t_compare_class c); /* "match", "spike", ... */

typedef struct {
    double threshold;          /* relative gap, default 0.01 */
    int window;                /* smoothing window in samples, 0 = auto: clamp(n/10, 3, 50) */
    int spike_window;          /* robust z window, default 50 (clamped to n/4, at least 5) */
    double spike_z;            /* default 6 */
    double recover_k;          /* back within median + k sigma, default 3 */
    int slow_recovery;         /* steps; a recovery slower than this points at FP8.
                            0 = auto: max(10, aligned span / 10) */
    double cosine_flag;        /* dump tensors with cosine below are flagged, default 0.99 */
    const fp8t_run *noise_run; /* a second baseline (e.g. BF16 with another seed) whose gap to A
                                  measures the noise; NULL (default): estimated from the runs'
                                  own step-to-step spread (see fp8t_compare_result.noise) */
} fp8t_compare_cfg;
void fp8t_compare_cfg_default(fp8t_compare_cfg *cfg);

typedef struct {
    int step;        /* step of the spike's first sample */
    int run;         /* 0 = A, 1 = B */
    double size_rel; /* (peak - median) / |median| of the run's own loss over the window */
    double zscore;
    int recovery_steps; /* steps until loss_run / loss_other is back within median + k sigma
                            of its window (back to the other run); -1: not before the end */
    int slow;           /* recovery slower than cfg.slow_recovery (or never) */
    int in_other_run;   /* the other run spikes within 2 steps too (data, not FP8) */
} fp8t_spike_report;

/* Per tensor site (layer, module, gemm, tensor) over the steps both runs inspected. */
typedef struct {
    int layer;
    char module[8], gemm[8], tensor[16];
    int n_steps;
    double cos_a, cos_b;     /* mean cosine of the FP8 image */
    double sqnr_a, sqnr_b;   /* mean SQNR dB (exact images counted as 200 dB) */
    double under_a, under_b; /* mean underflow % */
    double score;            /* sqnr_a - sqnr_b: positive = B quantizes worse */
    /* what-if recipes of the run they come from (B if it has them, else A): mean SQNR dB
     * (capped as above) and mean underflow % per recipe, NaN if absent; the best by SQNR */
    char whatif_run;    /* 'A', 'B' or 0: no what-if data */
    char precision[12]; /* the recipe in use there */
    double whatif_sqnr[FP8T_WHATIF_COUNT], whatif_under[FP8T_WHATIF_COUNT];
    int whatif_best; /* index into fp8t_whatif_names, -1 if none */
    /* block / rowwise sites: per run, the mean over the steps of the worst tile's SQNR (capped
     * as above) and the largest worst-tile underflow %; NaN where the run has no tile data */
    double tile_sqnr_a, tile_sqnr_b, tile_under_a, tile_under_b;
} fp8t_site_diff;

/* One dumped tensor present in both runs at the same step. */
typedef struct {
    int step;
    char name[96]; /* "<layer>.<module>.<gemm>.<tensor>" */
    size_t numel;
    double cosine, mse, sqnr_db, rel_l2; /* of B against A */
    int flagged;                         /* cosine < cfg.cosine_flag */
} fp8t_dump_diff;

typedef struct {
    fp8t_compare_class cls;
    char verdict[512]; /* one line: class and why */
    char advice[512];  /* what to try next (the seeds' procedure) */
    double threshold;
    /* aligned training loss (steps both runs logged with a loss) */
    int n;
    int *steps;              /* [n] */
    double *loss_a, *loss_b; /* [n] */
    double *gap;             /* [n] (B - A) / |A|, NaN where either is non-finite */
    double *gap_smooth;      /* [n] trailing median over `window` (fp8t_drift_detect) */
    int window;
    double mean_abs_gap, max_abs_gap;
    int max_gap_step;
    double early_gap; /* median |gap| over the first 10% (at least 3 samples) */
    double late_gap;  /* smoothed gap at the end (signed) */
    double trend;     /* least-squares slope of |gap| over the second half, per step */
    double gap_noise; /* robust sigma of gap - gap_smooth: the per-step noise of the gap */
    int drift_step;   /* step from which the smoothed |gap| stays above threshold; -1 */
    /* The noise of the end gap: how far the smoothed gap of two equally good runs ends apart.
     * With cfg.noise_run: the largest |smoothed gap| of the noise run against A over the second
     * half of their common steps; without: 2 * gap_noise (the per-step spread of the gap around
     * its smoothed value). An end gap inside max(threshold, noise) is a match, and a run B that
     * ends below A is never drift (docs/debugging.md). */
    double noise;
    int noise_from_run;   /* 1: measured with cfg.noise_run; 0: estimated from gap_noise */
    char noise_label[64]; /* the noise run's label ("" without) */
    double noise_val_gap; /* the noise run's last common val_loss gap against A; NaN if none */
    double val_gap;       /* relative gap of the last common val_loss; NaN if none */
    int val_step;
    /* spikes */
    fp8t_spike_report *spikes;
    int n_spikes;
    int slow_recovery; /* resolved cfg.slow_recovery */
    /* NaN */
    int nan_run; /* 0 A, 1 B, -1 none */
    int nan_step;
    char nan_where[256]; /* message of the NaN event, or "loss" */
    /* inspection statistics (stats.jsonl in both runs) */
    int have_stats; /* 0 none, 1 only one run (top = its worst sites), 2 both */
    fp8t_site_diff *sites;
    int n_sites; /* sorted, worst first */
    /* dumps */
    fp8t_dump_diff *dumps;
    int n_dumps, n_dumps_flagged; /* sorted by cosine, worst first */
    char dump_note[256];
    /* notes (warnings about the inputs, explanations) */
    char notes[8][256];
    int n_notes;
} fp8t_compare_result;

/* Compare run B against baseline A. 0 ok; -1 with err (bad input: exit code 2). */
int fp8t_compare_runs(fp8t_compare_result *res, const fp8t_run *a, const fp8t_run *b,
                      const fp8t_compare_cfg *cfg, char *err, size_t errlen);
void fp8t_compare_result_free(fp8t_compare_result *res);
/* 0 match, 1 any mismatch class. */
int fp8t_compare_exit_code(const fp8t_compare_result *res);
/* Human-readable summary, tables included. */
void fp8t_compare_print(FILE *f, const fp8t_run *a, const fp8t_run *b,
                        const fp8t_compare_result *res);
/* The same as one JSON object (malloc'd string). */
char *fp8t_compare_to_json(const fp8t_run *a, const fp8t_run *b, const fp8t_compare_result *res);

/* The dumps of two inspections compared tensor by tensor, as fp8t_compare_runs compares two
 * runs' dumps: every FP32 dump (<name>.npy, not its .fp8 / .scale_inv companions) of a step
 * directory step_NNNNNN/ present in both dumps_a and dumps_b (directories as the inspector
 * writes under OUT/dumps) with the dump of the same name in the other: cosine, MSE, SQNR and
 * relative L2 error of B against A, flagged below cosine_flag. *diffs malloc'd (may be NULL
 * when *n is 0), sorted worst cosine first; note (may be NULL) gets a remark about the inputs
 * ("" none: shapes that differ, no common step). 0 ok; -1 with err when a directory cannot be
 * read. */
int fp8t_compare_dump_dirs(fp8t_dump_diff **diffs, int *n, int *n_flagged, const char *dumps_a,
                           const char *dumps_b, double cosine_flag, char *note, size_t notelen,
                           char *err, size_t errlen);

/* ---- HTML report: one self-contained file (inline CSS + SVG, no scripts, no network) ---- */
int fp8t_report_html_write(const char *path, const fp8t_run *a, const fp8t_run *b,
                           const fp8t_compare_result *res, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
