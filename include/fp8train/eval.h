/* fp8train — inference on trained weights: validation loss in BF16 / FP8 / FP32, multiple-choice
 * tasks in llm.c's eval format (HellaSwag), sampling, and what the evaluation runs on the
 * inference model (generation, tasks). llm.c's GPT-2 tokenizer file is io's (tokenizer.h).
 *
 * Inference precisions:
 *   bf16  every linear GEMM with BF16 operands and FP32 accumulation.
 *   fp8   every linear GEMM in FP8 with DELAYED scaling from the weights' FP8 state (the scales
 *         learned in training, or seeded from an FP8 export's input_scale) and no history
 *         update: evaluating never changes a scale. The tied LM head (the embedding) stays in
 *         BF16, as in training by default and in the FP8 export. A state that never saw an
 *         amax (a fresh import) must be calibrated first: see fp8t_evaluator_calibrate.
 *   fp32  everything in FP32 (references, comparisons with other frameworks).
 */
#ifndef FP8TRAIN_EVAL_H
#define FP8TRAIN_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "fp8train/data.h"
#include "fp8train/export.h"
#include "fp8train/infer.h"
#include "fp8train/model.h"
#include "fp8train/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* the precisions (fp8t_eval_precision, with its name and parse) are the inference model's:
 * fp8train/infer.h */

/* A model for inference on micro-batches [B, T] holding w's parameters and FP8 state (a fresh
 * state when w has none or one of another size), plus the host buffers inference needs. The
 * policy's non-precision settings (hybrid format, margin, algo) come from w->policy_json when
 * present. opt: the model's options (NULL = defaults). Starts in BF16. NULL + err on failure. */
typedef struct fp8t_evaluator fp8t_evaluator;
fp8t_evaluator *fp8t_evaluator_create(fp8t_backend *be, const fp8t_weights *w,
                                      const fp8t_model_options *opt, int B, int T, char *err,
                                      size_t errlen);
void fp8t_evaluator_destroy(fp8t_evaluator *ev);
fp8t_model *fp8t_evaluator_model(fp8t_evaluator *ev);
int fp8t_evaluator_B(const fp8t_evaluator *ev);
int fp8t_evaluator_T(const fp8t_evaluator *ev);
/* Switch precision (keeps the FP8 state). */
void fp8t_evaluator_set_precision(fp8t_evaluator *ev, fp8t_eval_precision p);
fp8t_eval_precision fp8t_evaluator_precision(const fp8t_evaluator *ev);

/* 1 when no linear's X or W amax history holds a value (FP8 scales would all be 1). */
int fp8t_evaluator_needs_calibration(fp8t_evaluator *ev);
/* Run `batches` forwards of d (micro-batches 0..batches-1, which must be [B, T]) in BF16 to
 * record the amaxes of every linear input and weight, then one delayed-scaling update: the
 * scales a run would have after one step on these batches. Restores the precision. */
void fp8t_evaluator_calibrate(fp8t_evaluator *ev, const fp8t_data *d, int batches);
/* The FP8 recipe state (host copy, fp8t_recipe_state layout) into state[(len + 3) * n]. */
void fp8t_evaluator_fp8_state(fp8t_evaluator *ev, float *state, int *n, int *len);

/* How far an export's validation loss may sit from its checkpoint's (relative), used by
 * `fp8train eval --check-export` and the tests. FP32: identical weights, only summation order
 * could differ. BF16: weights rounded to 8 mantissa bits (2^-9 relative each); the BF16 GEMMs
 * round the linear weights anyway, so only norms, biases and embeddings move. FP8: E4M3
 * weights carry up to 2^-4 relative rounding each (measured on tiny models: ~1e-4; trained
 * models typically move 0.1-1%). */
#define FP8T_EXPORT_TOL_FP32 1e-5
#define FP8T_EXPORT_TOL_BF16 1e-2
#define FP8T_EXPORT_TOL_FP8 3e-2

/* Mean loss over micro-batches 0..batches-1 of d (opened with this B and T) in the current
 * precision: the mean of the per-batch mean losses. NaN on tokens outside the vocabulary. */
double fp8t_evaluator_loss(fp8t_evaluator *ev, const fp8t_data *d, int batches);
/* Loss of one micro-batch tokens/targets [B, T] (host); NaN on bad tokens. */
double fp8t_evaluator_batch_loss(fp8t_evaluator *ev, const int *tokens, const int *targets);

/* ---- multiple-choice tasks: llm.c's eval file format (dev/data/hellaswag.py) ----
 * header 256 x int32: magic 20240522, version 1, number of examples, longest example in bytes;
 * then per example, uint16 values: 65535 (start), example size in bytes (all of its uint16s,
 * the start included), example index, label, number of completions, context length, the
 * context tokens, then per completion its length and tokens. */
#define FP8T_TASK_MAGIC 20240522
#define FP8T_TASK_MAX_COMPLETIONS 16

typedef struct {
    int label; /* index of the correct completion */
    int n_completions;
    int ctx_len;
    int *ctx; /* [ctx_len] */
    int comp_len[FP8T_TASK_MAX_COMPLETIONS];
    int *comp[FP8T_TASK_MAX_COMPLETIONS]; /* [comp_len[c]] each */
} fp8t_task_example;

typedef struct {
    int n;                 /* examples */
    fp8t_task_example *ex; /* [n] (tokens owned) */
    int max_completions;   /* over the examples */
    int longest;           /* longest context + completion - 1 (the positions scored) */
    int max_token;         /* largest token id */
} fp8t_task;

int fp8t_task_read(const char *path, fp8t_task *t, char *err, size_t errlen);
/* Write t in the format above (tokens must be < 65535). */
int fp8t_task_write(const char *path, const fp8t_task *t, char *err, size_t errlen);
void fp8t_task_free(fp8t_task *t);
/* Add an example to t (copies the tokens). 0 ok, -1 bad sizes. */
int fp8t_task_add(fp8t_task *t, int label, const int *ctx, int ctx_len, int n_completions,
                  const int *const *comp, const int *comp_len);

/* Score every example as llm.c does: each completion's mean loss over its tokens given the
 * context; the lowest wins (ties: the first). The model must have B >= t->max_completions and
 * T >= t->longest (examples are packed several per micro-batch when they fit). correct gets
 * the number right; pred (may be NULL) [t->n] the chosen completion of each example.
 * 0 ok, -1 with err (tokens outside the vocabulary, model too small). */
int fp8t_task_eval(fp8t_evaluator *ev, const fp8t_task *t, int *correct, int *pred, char *err,
                   size_t errlen);
/* The scoring of fp8t_task_eval for any model: fn(ctx, tokens, targets, losses) fills the
 * per-position losses [B, T] (host) of a packed batch tokens/targets [B, T] (0 ok, -1 with
 * err); tokens, targets and losses are the caller's host buffers of B * T each. */
typedef int (*fp8t_task_losses_fn)(void *ctx, const int *tokens, const int *targets,
                                   float *losses, char *err, size_t errlen);
int fp8t_task_score(const fp8t_task *t, int B, int T, int V, int *tokens, int *targets,
                    float *losses, fp8t_task_losses_fn fn, void *ctx, int *correct, int *pred,
                    char *err, size_t errlen);

/* ---- sampling ---- */
typedef struct {
    float temperature; /* <= 0: greedy (argmax, ties: the lowest id) */
    int top_k;         /* <= 0: the whole vocabulary */
    uint64_t seed;     /* the sampler's random stream */
} fp8t_sample_cfg;

/* Append n_new tokens to prompt[n_prompt] (n_prompt >= 1) into out[n_new], feeding the model
 * the last T tokens each step (row 0 of a [B, T] model). Deterministic given cfg.
 * 0 ok, -1 with err. */
int fp8t_generate(fp8t_evaluator *ev, const int *prompt, int n_prompt, int n_new,
                  const fp8t_sample_cfg *cfg, int *out, char *err, size_t errlen);
/* One sampling decision on logits[V] (host), with the sampler state *rng (seeded by
 * fp8t_sample_seed). Exposed for tests. */
int fp8t_sample(const float *logits, int V, float temperature, int top_k, uint64_t *rng);
uint64_t fp8t_sample_seed(uint64_t seed);

/* ---- the evaluation on the inference model (src/train/eval_infer.c) ---- */

/* fp8t_task_eval (eval.h) through the inference model: the same packing and scoring (each
 * completion's mean loss given the context, the lowest wins). The model needs B >=
 * t->max_completions and Tmax >= t->longest. 0 ok; -1 with err. */
int fp8t_infer_task_eval(fp8t_infer *m, const fp8t_task *t, int *correct, int *pred, char *err,
                         size_t errlen);

/* Continue n prompts (prompts[i] of lens[i] >= 1 tokens, n <= B) by n_new tokens each into
 * out[i * n_new + j]: a prefill, then n_new - 1 decode steps. Sequence i samples with its
 * own random stream, fp8t_sample_seed(cfg->seed + i), so sequence 0 reproduces
 * fp8t_generate's stream. Needs max(lens) + n_new - 1 <= Tmax. 0 ok; -1 with err. */
int fp8t_infer_generate(fp8t_infer *m, const int *const *prompts, const int *lens, int n,
                        int n_new, const fp8t_sample_cfg *cfg, int *out, char *err,
                        size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
