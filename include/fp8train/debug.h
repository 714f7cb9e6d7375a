/* fp8train — debugging instruments that ride on a training run. The trainer installs ONE model
 * hook (fp8t_model_set_hook) that calls, for every GEMM tensor site in execution order:
 *   fp8t_injector_observe  (may perturb the tensor: fault injection)
 *   fp8t_nan_tracker_observe (remembers the first non-finite tensor of the step)
 *   fp8t_inspector_observe (statistics -> stats.jsonl, dumps -> .npy)
 * Each *_begin_step/end_step pair brackets one optimizer step (all its micro-batches). */
#ifndef FP8TRAIN_DEBUG_H
#define FP8TRAIN_DEBUG_H

#include <stdio.h>
#include "fp8train/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- inspect ----
 * spec: comma-separated key=value, e.g.
 *   "every=10,start=0,end=1000,layers=0-3,modules=qkv+fc2,gemms=fprop+dgrad,
 *    tensors=input+weight+grad_output+output+dgrad+wgrad,block=128,dump=1,whatif=all"
 * Missing keys select everything; every defaults to 1; whatif=default computes the per-tensor
 * current-scaling and 1x128-block what-ifs of each operand in both formats, whatif=all MXFP8's
 * as well. Writes OUT/stats.jsonl (one JSON object
 * per tensor site per selected step) and, with dump=1, OUT/dumps/step_NNNNNN/<site>.npy (FP32
 * values) and <site>.fp8.npy (uint8 codes) + <site>.scale_inv.npy.
 * Errors (err) name the key at fault, not an option: the caller prefixes the option the spec
 * came from ("--inspect: layers=x: expected ..."). */
typedef struct fp8t_inspector fp8t_inspector;
/* NULL with err on a bad spec, no out_dir, or OUT/stats.jsonl that cannot be opened. */
fp8t_inspector *fp8t_inspector_create(const char *spec, const char *out_dir, char *err,
                                      size_t errlen);
/* 0 if spec (NULL: "") parses; else -1 with err. Writes nothing, needs no model. */
int fp8t_inspector_spec_check(const char *spec, char *err, size_t errlen);
void fp8t_inspector_destroy(fp8t_inspector *in);
void fp8t_inspector_begin_step(fp8t_inspector *in, int step);
void fp8t_inspector_observe(fp8t_inspector *in, fp8t_model *m, const fp8t_tensor_site *site,
                            float *x);
/* The step's statistics come back from the device in one copy here. Their stats.jsonl lines
 * are written here too, unless step + 1 is inspected as well: then the next step's hook calls
 * write them a few at a time (formatting them exactly is most of the host's time per site,
 * and the device has that step's work queued meanwhile), and the next end_step the rest. */
void fp8t_inspector_end_step(fp8t_inspector *in, int step);
/* Every line still to be written goes into stats.jsonl, and the file is flushed (a failure
 * shows in fp8t_inspector_write_error). destroy does it too, silently. */
void fp8t_inspector_flush(fp8t_inspector *in);
/* The first failed write of stats.jsonl (disk full), naming the file; NULL while all went in. */
const char *fp8t_inspector_write_error(const fp8t_inspector *in);
/* A second destination for the statistics (train --tensorboard). For every site the inspector
 * writes a row of on the step's first micro-batch, fn gets the site as a tag-friendly name
 * ("layer03.fc2.dgrad.grad_output", "head.head.fprop.input") and one call per statistic:
 * "underflow_pct", "saturation_pct", "sqnr_db", "scale" (quantized operands) and "amax" (every
 * site), values finite as a float only (an exact quantization's SQNR, 1e300: no call).
 * NULL: none. */
typedef void (*fp8t_inspect_sink)(void *ctx, int step, const char *site, const char *stat,
                                  double value);
void fp8t_inspector_set_sink(fp8t_inspector *in, fp8t_inspect_sink fn, void *ctx);
/* 1 while the step begun by fp8t_inspector_begin_step is selected: a caller installs its
 * model hook only then (a hooked model takes slower, unfused paths). */
int fp8t_inspector_active(const fp8t_inspector *in);
/* 1 when the inspector can take its tensors from a read-only hook (fp8t_model_set_observer):
 * it writes the row of a Wgrad X shown without the tensor (x NULL) from the Fprop X's. 0 with
 * dumps or block lists (they need every tensor). */
int fp8t_inspector_reads_only(const fp8t_inspector *in);
/* Pinned bytes of dumps in flight to the writer thread (default 2 GiB; beyond it a dump waits
 * for the disk). Before the first dump; 0 keeps the default. */
void fp8t_inspector_set_dump_budget(fp8t_inspector *in, size_t bytes);
/* On (the default): a site that shows the same tensor under the same request as an earlier
 * site of the step (the Wgrad's dY and X, the Dgrad's W: the tensors the other GEMM of the
 * linear saw) takes that site's statistics instead of reading the tensor again; its row is
 * the same. Valid only when nothing writes the tensors between the sites: off (0) when a
 * writing hook (fault injection) shares the model hook. */
void fp8t_inspector_set_reuse(fp8t_inspector *in, int on);
/* After the step's backward, before fp8t_model_end_step (the delayed-scaling update): when
 * step + 1 is inspected, notes per tensor the amax that update computes the next scale from,
 * reported as amax_history_max of step + 1. */
void fp8t_inspector_before_scale_update(fp8t_inspector *in, fp8t_model *m, int step);

/* ---- NaN/Inf provenance ---- */
typedef struct fp8t_nan_tracker fp8t_nan_tracker;
fp8t_nan_tracker *fp8t_nan_tracker_create(void);
void fp8t_nan_tracker_destroy(fp8t_nan_tracker *t);
void fp8t_nan_tracker_begin_step(fp8t_nan_tracker *t, int step);
void fp8t_nan_tracker_observe(fp8t_nan_tracker *t, fp8t_model *m, const fp8t_tensor_site *site,
                              float *x);
/* 1 if a non-finite tensor was seen this step; describes the first one into buf
 * ("layer 2 fc2 fprop output (forward)"). */
int fp8t_nan_tracker_first(const fp8t_nan_tracker *t, char *buf, size_t len);

/* ---- fault injection ----
 * spec: "layer=2,module=fc2,gemm=dgrad,tensor=grad_output,kind=scale:64|outliers:1e4|stale-amax|nan,from=50[,to=80]"
 * (tensor defaults to the GEMM's first operand: input for fprop, grad_output for dgrad/wgrad;
 *  layer may be a range A-B). */
typedef struct fp8t_injector fp8t_injector;
fp8t_injector *fp8t_injector_create(const char *spec, char *err, size_t errlen);
void fp8t_injector_destroy(fp8t_injector *inj);
void fp8t_injector_begin_step(fp8t_injector *inj, int step);
void fp8t_injector_observe(fp8t_injector *inj, fp8t_model *m, const fp8t_tensor_site *site,
                           float *x);
/* After the step's backward, before fp8t_model_end_step: amax faults edit the FP8 state. */
void fp8t_injector_before_scale_update(fp8t_injector *inj, fp8t_model *m, int step);

/* ---- detectors on a metric series ---- */
typedef struct {
    int window; /* samples in the robust window (median / MAD) */
    double z;   /* robust z-score threshold */
} fp8t_spike_cfg;
typedef struct {
    int is_spike;
    double zscore; /* (x - median) / sigma */
    double median; /* the level x is expected at: the window's median, or where a trend
                             dominates the window, the last sample plus the median change */
    double sigma;  /* the robust sigma z is measured in (of the window, or of its
                             step-to-step changes) */
} fp8t_spike_verdict;
/* Judge sample x against the previous `n` samples hist[0..n-1] (oldest first; the last
 * cfg->window of them, at least 5 finite). Where a trend dominates the window (a loss falling
 * fast in the first steps) x is judged by its change from the last sample against the window's
 * step-to-step changes, so the trend does not hide a spike. */
fp8t_spike_verdict fp8t_spike_check(const fp8t_spike_cfg *cfg, const double *hist, int n,
                                    double x);

#ifdef __cplusplus
}
#endif
#endif
