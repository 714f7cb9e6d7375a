/* fp8train — the FP8 debugging procedure, automated (`fp8train bisect`).
 *
 * From one start (a fresh init with the run's seed, or a checkpoint) and one data order, short
 * training runs compare the run's FP8 policy with a BF16 baseline and narrow the difference
 * down, macro to micro:
 *   bf16        everything in BF16: the baseline
 *   fp8         the policy as configured (stop here when its gap is under the threshold)
 *   recovery    the fp8 run's checkpoint at the midpoint continued in BF16: does the loss
 *               come back to the baseline (the damage is not permanent)?
 *   fake        every GEMM fake-quantized (FP8 values, current scaling, BF16 GEMM)
 *   <gemm>-bf16 one GEMM kind (fprop, dgrad, wgrad) back in BF16 at a time: the culprit kind
 *               is the one that closes the gap (two kinds together when no single one does)
 *   layers-A-B  binary search over layer ranges with the culprit in BF16: the smallest range
 *               whose override closes the gap
 *   current, block, rowwise
 *               the culprit (kind and layers) in each of the FP8 recipes that might fix it
 *               instead of BF16 (per-tensor current scaling, DeepSeek-V3 block scaling, per-row
 *               scaling), each tried unless the culprit already runs in it; the cheapest that
 *               closes the gap is the fix (cheapest first: current, block, rowwise, BF16 — the
 *               GEMM keeps running in FP8, and block's and rowwise's speed targets on Hopper are
 *               1.2x and 1.15x BF16)
 * The gap of a run is its relative loss difference against the baseline over the last ~10% of
 * the steps (at least 5): the median over those steps of (loss - loss_bf16) / |loss_bf16| on
 * the same batch, +Inf where the run has no finite loss. A median of per-step differences,
 * not a difference of means, because one hard batch can make one run's loss jump (seen on the
 * synthetic corpus: +16% at one step, every other step within 0.3%). A run "closes the gap"
 * when |gap| < threshold. An experiment that ends below the baseline measures the noise of the
 * setup (fp8t_bisect_noise); when that exceeds the threshold the result is flagged unreliable.
 * Every experiment is an ordinary run directory OUT/bisect/<name>/;
 * OUT/bisect/bisect.json and OUT/bisect/report.html summarize them.
 */
#ifndef FP8TRAIN_BISECT_H
#define FP8TRAIN_BISECT_H

#include <stdio.h>

#include "fp8train/train.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FP8T_BISECT_MAX_EXP 48

/* How many FP8 recipes bisect tries for the culprit before settling on BF16 (current, block,
 * rowwise: cheapest first). */
#define FP8T_BISECT_N_ALTS 3

typedef struct {
    /* The run under investigation: model, data, seed, optimizer, device, FP8 policy, --inject
     * and --resume. Its steps / out_dir / checkpoint / detector settings are replaced per
     * experiment. */
    fp8t_train_config train;
    int steps;        /* optimizer steps per experiment, counted from the start point */
    double threshold; /* |gap| below which two runs match (default 0.01) */
    double tail_frac; /* fraction of the last steps judged (default 0.1; at least 5 steps,
                             at most half) */
    char out_dir[FP8T_PATH_MAX]; /* experiments go into out_dir/<name>/ (a new or empty
                                    directory, or a previous bisect's) */
    FILE *log;                   /* progress lines, evidence table, conclusion; NULL: silent */
} fp8t_bisect_config;

/* Defaults: train per fp8t_train_config_default, steps 60, threshold 0.01, tail 0.1,
 * out_dir "runs/bisect", log stdout. */
void fp8t_bisect_config_default(fp8t_bisect_config *c);

typedef struct {
    char name[96];             /* directory under OUT/bisect/ */
    char what[160];            /* what the experiment tests, one line */
    char override[256];        /* overrides added to the policy ("" = none); same syntax as
                             --override */
    int ran;                   /* 0: skipped (see verdict) */
    int stop;                  /* fp8t_stop_reason of the run */
    int finished;              /* reached the last step with finite losses */
    int first_step, last_step; /* steps the run logged */
    double final_loss;         /* training loss of the last step */
    double tail_loss;          /* mean training loss over the tail window */
    double gap;                /* median relative loss difference vs BF16 over the tail window;
                             +Inf when the run did not finish with finite losses */
    int closes;                /* |gap| < threshold */
    double seconds;
    char verdict[200]; /* what this result says so far */
} fp8t_bisect_exp;

typedef enum {
    FP8T_BISECT_NO_PROBLEM = 0, /* plain FP8 already matches BF16 */
    FP8T_BISECT_FOUND,          /* culprit found and an override closes the gap */
    FP8T_BISECT_NO_FIX,         /* FP8 is off but no tested override closes the gap */
} fp8t_bisect_outcome;

typedef struct {
    fp8t_bisect_outcome outcome;
    double baseline_loss;         /* BF16 tail loss */
    int tail_steps;               /* steps judged at the end of every experiment */
    double fp8_gap;               /* gap of the policy as configured */
    int recovered;                /* recovery experiment: 1 back to baseline, 0 not, -1 not run */
    int fake_matches;             /* all-fake run closes the gap: 1 / 0, -1 not run */
    unsigned culprit_gemms;       /* bit (1u << fp8t_gemm_kind) of the culprit kinds; 0 none */
    int n_layer;                  /* transformer layers of the model */
    int layer_lo, layer_hi;       /* culprit span, inclusive, over positions 0..n_layer-1 (the
                                 layers) and n_layer (the LM head, searched when the policy
                                 runs it in FP8); -1 when not found */
    fp8t_precision fix_precision; /* current, block, rowwise or bf16 (the cheapest closing) */
    char alternatives[384]; /* the FP8 alternatives tried for the culprit and their verdicts,
                                 one line ("current does not close (gap +1.20%); block closes
                                 (gap +0.10%); rowwise ..."); "" before the culprit is found */
    char override[256];     /* the cheapest closing override, ready for --override '...' */
    double fix_gap;         /* gap of the run with that override */
    /* How far runs that differ only by rounding spread here (fp8t_bisect_noise): every
     * experiment only replaces BF16 GEMMs of the baseline by FP8, fake-quantized or
     * current-scaled ones, so one that ends BELOW the baseline does so by chance. */
    double noise;          /* max over the experiments other than the baseline of -gap;
                                 0 when none ends below it */
    int noise_exp;         /* index in exp[] of the experiment that set it; -1 if none */
    int reliable;          /* noise <= threshold; 0: the gaps cannot be told apart from
                                 noise, the culprit and fix are unconfirmed best guesses */
    char conclusion[1536]; /* a few lines for people */
    int n_exp;
    fp8t_bisect_exp exp[FP8T_BISECT_MAX_EXP];
} fp8t_bisect_result;

/* Run the procedure. 0 when it ran to a conclusion (res->outcome says which); -1 on bad input
 * or a failed experiment, with err naming the cause (exit code 2). */
int fp8t_bisect_run(const fp8t_bisect_config *cfg, fp8t_bisect_result *res, char *err,
                    size_t errlen);
/* 0 for NO_PROBLEM and FOUND, 1 for NO_FIX, whether reliable or not (a script that must
 * not act on an unconfirmed culprit reads "reliable" in bisect.json). */
int fp8t_bisect_exit_code(const fp8t_bisect_result *res);
/* The noise of a bisect: the largest amount by which an experiment that ran, other than the
 * baseline (the one named "bf16"), ends below the baseline, i.e. the max of -gap over them; 0
 * when none does (non-finite gaps are ignored). *which (may be NULL) gets the index in
 * r->exp of that experiment, -1 when the noise is 0. Pure. */
double fp8t_bisect_noise(const fp8t_bisect_result *r, int *which);
/* Sets r->noise, r->noise_exp and r->reliable (noise <= threshold) from r's experiments;
 * returns r->reliable. fp8t_bisect_run calls it once the experiments are done. */
int fp8t_bisect_judge_noise(fp8t_bisect_result *r, double threshold);
/* The evidence table and the conclusion (what fp8t_bisect_run prints at the end), preceded
 * by a WARNING paragraph when fp8t_bisect_noise(res) exceeds threshold. */
void fp8t_bisect_print(FILE *f, const fp8t_bisect_result *res, double threshold);
/* Mean training loss of RUN/metrics.jsonl over the steps after last_step - tail_steps (at
 * least the last logged step); *last gets the last step's loss. 0 ok (a non-finite loss in the
 * tail makes the mean NaN), -1 with err when the file is missing or has no loss. */
int fp8t_bisect_tail_loss(double *mean, double *last, int *first_step, int *last_step,
                          const char *run_dir, int tail_steps, char *err, size_t errlen);

/* The gap of RUN against BASE over steps last_step - tail_steps + 1 .. last_step: the median
 * of the per-step relative loss differences (+Inf for a step the run lacks or where its loss
 * is non-finite). 0 ok; -1 with err when a file is unreadable or the baseline lacks a step. */
int fp8t_bisect_gap(double *gap, const char *run_dir, const char *base_dir, int last_step,
                    int tail_steps, char *err, size_t errlen);
/* Steps judged at the end of each experiment: tail_frac * steps, at least 5, at most half. */
int fp8t_bisect_tail_steps(const fp8t_bisect_config *cfg);

#ifdef __cplusplus
}
#endif
#endif
