/* fp8train — inspecting trained weights without training them (`fp8train inspect WEIGHTS`).
 *
 * An inspection pass runs forward AND backward (no optimizer update, no scale update) on a few
 * micro-batches of an evaluator's model (fp8t_evaluator_create: a checkpoint, an HF export or
 * an llm.c file, with its FP8 state) under a chosen precision policy, with the tensor inspector
 * of debug.h attached: OUT/stats.jsonl and, with dump=1, OUT/dumps/step_NNNNNN/. A second pass
 * of the same micro-batches with every GEMM in BF16 into another directory, then
 * fp8t_compare_dump_dirs (compare.h) on the two dump directories, is the seeds' "dump tensors
 * and compare them with BF16" step: a tensor whose cosine against BF16 is below 0.99 carries
 * too much quantization error.
 *
 * Selection of the GEMM sites, statistics and dump layout: fp8t_inspector_create (debug.h). */
#ifndef FP8TRAIN_INSPECT_CHECKPOINT_H
#define FP8TRAIN_INSPECT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "fp8train/data.h"
#include "fp8train/eval.h"
#include "fp8train/policy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The seeds' rule: cosine similarity below this => that tensor's quantization error is too
 * large. */
#define FP8T_INSPECT_COSINE_FLAG 0.99

typedef struct {
    const fp8t_policy *policy; /* precision of every GEMM during the pass */
    const char *spec;          /* inspector selection (debug.h syntax); NULL or "" = everything */
    const char *out_dir;       /* stats.jsonl and dumps/ are written here (created) */
    const char *inject;        /* fault injection (debug.h syntax); NULL or "" = none */
    int step;                  /* step number of the stats rows and of the dump directory */
    uint64_t first_batch;      /* index in d of the first micro-batch */
    int batches;               /* micro-batches, each one forward + one backward */
} fp8t_inspect_pass_cfg;

typedef struct {
    int batches;               /* micro-batches run */
    double loss;               /* mean of their losses (NaN if one was not finite) */
    int nonfinite;             /* a GEMM tensor held a NaN or an Inf */
    char first_nonfinite[256]; /* the first one, "layer 2 fc2 fprop output (forward)" */
    long injected;             /* perturbations the fault applied (0 without --inject) */
} fp8t_inspect_pass_result;

/* One inspection pass on ev's model; d must be opened with ev's B and T. The evaluator is left
 * as it was (its precision and its FP8 recipe state, so passes under different policies see
 * the same scales); the gradients are left holding the pass's sum. stats.jsonl in out_dir is
 * appended to (fp8t_inspect_prepare_out empties it first). 0 ok; -1 with err (bad spec, bad
 * fault, unwritable directory). */
int fp8t_inspect_pass(fp8t_evaluator *ev, const fp8t_data *d, const fp8t_inspect_pass_cfg *cfg,
                      fp8t_inspect_pass_result *res, char *err, size_t errlen);

/* Delayed scaling needs an amax history. When ev's state never saw an amax (a fresh import),
 * run `batches` micro-batches from first_batch forward and backward in BF16 (amaxes of X, W and
 * dY are recorded in every precision) and one delayed-scaling update: the scales a run would
 * have after one step on them (eval's fp8t_evaluator_calibrate runs forwards only, so leaves
 * the dY scales at 1: too coarse for gradients). Returns 1 calibrated, 0 not needed. */
int fp8t_inspect_calibrate(fp8t_evaluator *ev, const fp8t_data *d, uint64_t first_batch,
                           int batches);

/* Make dir ready for an inspection: create it; refuse (-1 with err) a training run directory
 * (it holds metrics.jsonl) or a directory holding stats.jsonl or dumps/ that an inspection did
 * not write (no inspect.json); remove the stats.jsonl, dumps/ and bf16/ of an earlier
 * inspection, and mark dir as an inspection output (inspect.json, overwritten by the caller
 * with its summary). */
int fp8t_inspect_prepare_out(const char *dir, char *err, size_t errlen);

/* One inspected GEMM tensor site, its stats.jsonl rows (one per micro-batch) merged. */
typedef struct {
    int layer; /* -1: the LM head */
    char module[8], gemm[8], tensor[16], precision[12];
    int is_operand; /* input / weight / grad_output: quantized by its GEMM */
    int quantized;  /* the GEMM runs in an FP8 precision (not bf16 / fp32): the
                                      error statistics are what training suffers; otherwise
                                      they say what FP8 would do */
    int n;          /* rows merged */
    double amax;    /* largest over the rows */
    double scale;   /* the scale the statistics used (first row) */
    double underflow_pct, saturation_pct; /* largest over the rows (operands; NaN for results) */
    double sqnr_db, cosine; /* smallest (worst) over the rows (operands; NaN for results) */
    double nonfinite;       /* NaN + Inf elements, summed */
    int flagged;            /* quantized operand with cosine < cosine_flag (or no
                                      cosine at all), or a tensor with non-finite values */
} fp8t_inspect_site;

/* Read stats.jsonl rows of `step` (all steps when step < 0) and merge them per site, sorted in
 * model order (layers ascending, the head last; modules, GEMMs and tensors in their enum order).
 * *sites malloc'd (may be NULL when *n is 0). 0 ok; -1 with err. */
int fp8t_inspect_sites_read(fp8t_inspect_site **sites, int *n, const char *stats_path, int step,
                            double cosine_flag, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
