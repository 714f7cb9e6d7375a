/* The evaluator's state, shared by src/train/eval*.c (not a public API). */
#ifndef FP8TRAIN_EVAL_INTERNAL_H
#define FP8TRAIN_EVAL_INTERNAL_H

#include "fp8train/eval.h"
#include "fp8train/policy.h"

struct fp8t_evaluator {
    fp8t_model *m;
    int B, T, V;
    fp8t_policy policy; /* the weights' policy: formats, margin, algo (precisions replaced) */
    fp8t_eval_precision prec;
    int *tokens, *targets; /* host [B*T] */
    float *losses;         /* host [B*T] per-position losses */
    float *row;            /* host [V] one row of logits */
};

#endif
