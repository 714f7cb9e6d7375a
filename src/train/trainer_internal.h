/* The trainer's private state and the pieces it is made of (src/train/trainer*.c, runlog_write.c,
 * online_detectors.c, schedule.c). */
#ifndef FP8TRAIN_TRAINER_INTERNAL_H
#define FP8TRAIN_TRAINER_INTERNAL_H

#include <stdio.h>

#include "fp8train/data.h"
#include "fp8train/debug.h"
#include "fp8train/error.h"
#include "fp8train/tensorboard.h"
#include "fp8train/train.h"
#include "train/dist_train.h"
#include "train/train_internal.h"

/* ---- learning rate (schedule.c) ---- */
/* LR of optimizer step t (1-based): linear warmup over `warmup` steps, then cosine from lr to
 * lr * min_lr_frac at step `steps`. */
float fp8t_lr_at(const fp8t_train_config *c, int t);

/* ---- one metrics.jsonl row ---- */
typedef struct {
    int step;
    float loss;    /* training loss (mean over the micro-batches) */
    int nonfinite; /* loss or gradient non-finite: "loss": null */
    float lr, grad_norm;
    double tokens_per_s, elapsed_s;
    float val_loss;                /* NaN: not evaluated this step */
    float shadow_loss, shadow_gap; /* NaN: no shadow this step */
    double drift_gap;              /* NaN: no baseline at this step */
    int fallback;                  /* the step ran in BF16 because of a shadow fallback */
    const char *precision;         /* "fp8", "bf16", ... */
} step_record;

/* ---- online detectors (online_detectors.c) ---- */
typedef struct {
    fp8t_spike_cfg cfg;
    double *hist; /* [cap] last losses, oldest first */
    int n, cap;
    int in_spike, spike_step;
    double recover_below; /* median + margin of the window before the spike */
} spike_state;

typedef struct {
    int n_base; /* baseline: steps and losses sorted by step */
    int *base_step;
    double *base_loss;
    double *a, *b; /* aligned baseline / run losses seen so far */
    int n, cap;
    int window;
    int above;      /* currently above the threshold */
    int first_step; /* first step of the run (for early / late) */
} drift_state;

/* ---- the trainer ---- */
typedef struct {
    fp8t_train_config cfg; /* resolved */
    int B, T, accum;
    fp8t_backend *be;
    fp8t_model *model; /* the model being trained; validation and shadow BF16 run
                                  frozen forwards on it (fp8t_model_set_frozen) */
    fp8t_data *train, *val;
    int *tokens, *targets;   /* [B*T] host */
    fp8t_policy run_policy;  /* the configured policy */
    fp8t_policy bf16_policy; /* everything in BF16 (shadow, fallback, rollback) */
    int in_bf16;             /* the model currently runs bf16_policy */
    /* debugging instruments and the one model hook that drives them */
    fp8t_inspector *inspector;
    fp8t_injector *injector;
    fp8t_nan_tracker *nan;
    int track_nan;    /* the NaN tracker observes (only while re-running a bad step) */
    int hook_inspect; /* the inspector observes */
    /* logs */
    FILE *metrics, *events;
    int n_events;
    int step_now;           /* the step the loop is in (0 before it): warnings name it */
    fp8t_warn_fn prev_warn; /* the warning handler before the run's, restored after it */
    void *prev_warn_ctx;
    fp8t_tb_writer *tb; /* --tensorboard event file (NULL: off) */
    /* detectors */
    spike_state spike;
    drift_state drift;
    int shadow_action, fallback_steps;
    int fallback_left; /* steps left to run in BF16 after a shadow alarm */
    int bf16_until;    /* after a rollback: BF16 up to and including this step */
    int rollbacks;
    /* progress */
    int start_step;       /* 0 or the resumed step */
    double t0;            /* wall clock at the first step */
    double train_seconds; /* time in training steps (not validation / checkpoints) */
    double tokens_done;
    double prog_t, prog_tokens; /* wall clock and tokens_done at the last progress line */
    char last_ckpt[FP8T_TRAIN_PATH_BUF]; /* newest good checkpoint ("" none) */
    size_t resume_nonfinite; /* non-finite weights in the --resume checkpoint (then it is no
                                  "good" checkpoint: last_ckpt stays "") */
    float last_val;
    dp_state dp; /* data parallel (dist_train.c): this rank's place and shards */
    /* the run directory (rundir.c) */
    int lock_fd;  /* OUT/.lock, flock'ed for the whole run (-1 none) */
    int same_run; /* resumed from a checkpoint of OUT itself: the run continues */
    char aside_dir[FP8T_TRAIN_PATH_BUF]; /* same_run: where the old run's later steps go */
    int moved_ckpts;                     /* same_run: how many of its checkpoints went there */
    char write_err[2 * FP8T_TRAIN_PATH_BUF + 512]; /* first failed log write ("" none): the loop
                                                  stops with it */
} trainer;

double trainer_now(void);

/* rundir.c: before anything is written into OUT: create it, take OUT/.lock (a second training
 * into OUT fails at once), refuse a directory holding another run unless --overwrite (then
 * remove that run's checkpoints, fp8train's own only), and on a resume into its own run move
 * the old run's checkpoints after resume_step to t->aside_dir. 0 ok, -1 + err. */
int rundir_prepare(trainer *t, int resume_step, char *err, size_t errlen);
void rundir_unlock(trainer *t);
/* Is the checkpoint directory inside OUT/checkpoints (a resume into the run that wrote it)? */
int rundir_same_run(const char *out_dir, const char *ckpt);

/* runlog_write.c: metrics.jsonl / events.jsonl. On a fresh run both are emptied; on a resume
 * into the same directory (t->same_run), the rows after the resumed step (the future the
 * resumed run recomputes) are moved to t->aside_dir, and the kept losses seed the spike
 * detector. A failed write truncates the file back to its last whole line and sets
 * t->write_err, which stops the training loop. */
int runlog_open(trainer *t, int resume_step, char *err, size_t errlen);
/* Keep the lines of the JSONL file `path` whose "step" is <= max_step (rewritten atomically;
 * no file: nothing to do); the other lines go to `aside` (appended, its directory created)
 * when it is not NULL. The kept rows' losses are pushed to `spike` (may be NULL). */
int runlog_keep_prefix(const char *path, int max_step, spike_state *spike, const char *aside,
                       char *err, size_t errlen);
void runlog_close(trainer *t);
void runlog_metrics(trainer *t, const step_record *r);
/* --tensorboard (rank 0): open a new event file in the directory, marked as a session that
 * starts at the run's first step, and send the inspector's statistics there too (0 or -1 +
 * err); write one step's scalars (its metrics row and the statistics the inspector queued
 * during the step) as one flushed event; mark a restart at `step` (a shadow rollback re-runs
 * the steps from there); close (0 or -1 + err). A failed write sets t->write_err, which
 * stops the training loop like a failed metrics.jsonl write. */
int runlog_tb_open(trainer *t, char *err, size_t errlen);
void runlog_tb_step(trainer *t, const step_record *r);
void runlog_tb_restart(trainer *t, int step);
int runlog_tb_close(trainer *t, char *err, size_t errlen);
/* kind: nan | spike | drift | shadow | fallback | rollback; extra: "" or ",\"key\":value..." */
void runlog_event(trainer *t, int step, const char *kind, const char *message, const char *extra);
void runlog_warning(trainer *t, const char *line);

/* online_detectors.c */
void spike_init(spike_state *s, int window, double z);
void spike_free(spike_state *s);
void spike_push(spike_state *s, double loss); /* history only (no judgement) */
/* Judge and push one step's loss; writes events. */
void spike_observe(trainer *t, int step, double loss);
/* Load the baseline run (a directory or its metrics.jsonl). 0 ok, -1 + err. */
int drift_load(drift_state *d, const char *baseline, int first_step, char *err, size_t errlen);
void drift_free(drift_state *d);
/* Smoothed relative gap at this step (NaN when the baseline has no row for it); writes an
 * event when it crosses the threshold either way. */
double drift_observe(trainer *t, int step, double loss);

#endif
