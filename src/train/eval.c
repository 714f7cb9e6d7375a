/* Inference on trained weights: an evaluator (model + host buffers) built from fp8t_weights,
 * the three inference precisions, FP8 calibration of a state that never saw an amax, and the
 * validation loss. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/error.h"
#include "fp8train/eval.h"
#include "fp8train/policy_json.h"
#include "fp8train/recipe.h"
#include "train/eval_internal.h"

fp8t_evaluator *fp8t_evaluator_create(fp8t_backend *be, const fp8t_weights *w,
                                      const fp8t_model_options *opt, int B, int T, char *err,
                                      size_t errlen) {
    char e[FP8T_ERR_LEN];
    if (!be || !w || !w->params) {
        fp8t_errorf(err, errlen, "evaluator: no backend or no weights");
        return NULL;
    }
    size_t total;
    fp8t_model_param_table(&w->model, NULL, &total);
    if (total != w->num_params) {
        fp8t_errorf(err, errlen,
                    "evaluator: the weights hold %zu parameters but their model config "
                    "needs %zu",
                    w->num_params, total);
        return NULL;
    }
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    if (w->policy_json && fp8t_policy_from_json(&pol, w->policy_json, e, sizeof(e)) != 0)
        fp8t_policy_default(&pol); /* an unreadable saved policy only loses format details */
    pol.n_overrides = 0;
    const int n_fp8 = 3 * fp8t_model_num_linears(&w->model);
    const int have_state = w->fp8_state && w->fp8_n == n_fp8 && w->fp8_len >= 1;
    if (have_state) pol.history_len = w->fp8_len;
    fp8t_evaluator *ev = calloc(1, sizeof(*ev));
    if (!ev) {
        fp8t_errorf(err, errlen, "evaluator: out of memory");
        return NULL;
    }
    ev->B = B;
    ev->T = T;
    ev->V = w->model.vocab_size;
    ev->policy = pol;
    ev->m = fp8t_model_create(be, &w->model, &pol, opt, B, T, e, sizeof(e));
    if (!ev->m) {
        fp8t_errorf(err, errlen, "cannot create the model for evaluation: %s", e);
        free(ev);
        return NULL;
    }
    const size_t N = (size_t)B * T;
    ev->tokens = malloc(N * sizeof(int));
    ev->targets = malloc(N * sizeof(int));
    ev->losses = malloc(N * sizeof(float));
    ev->row = malloc((size_t)ev->V * sizeof(float));
    if (!ev->tokens || !ev->targets || !ev->losses || !ev->row) {
        fp8t_errorf(err, errlen, "evaluator: out of memory");
        fp8t_evaluator_destroy(ev);
        return NULL;
    }
    be->ops->to_device(be, fp8t_model_params(ev->m), w->params, total * sizeof(float));
    if (have_state)
        be->ops->to_device(be, fp8t_model_fp8_state(ev->m), w->fp8_state,
                           fp8t_recipe_state_floats(w->fp8_n, w->fp8_len) * sizeof(float));
    fp8t_evaluator_set_precision(ev, FP8T_EVAL_BF16);
    return ev;
}

void fp8t_evaluator_destroy(fp8t_evaluator *ev) {
    if (!ev) return;
    fp8t_model_destroy(ev->m);
    free(ev->tokens);
    free(ev->targets);
    free(ev->losses);
    free(ev->row);
    free(ev);
}

fp8t_model *fp8t_evaluator_model(fp8t_evaluator *ev) { return ev->m; }
int fp8t_evaluator_B(const fp8t_evaluator *ev) { return ev->B; }
int fp8t_evaluator_T(const fp8t_evaluator *ev) { return ev->T; }
fp8t_eval_precision fp8t_evaluator_precision(const fp8t_evaluator *ev) { return ev->prec; }

void fp8t_evaluator_set_precision(fp8t_evaluator *ev, fp8t_eval_precision p) {
    fp8t_policy pol = ev->policy;
    pol.n_overrides = 0;
    switch (p) {
    case FP8T_EVAL_FP8:
        /* the learned scales: delayed scaling from the state, which only an end_step (never
         * called while evaluating) would update */
        pol.default_precision = FP8T_PREC_DELAYED;
        pol.recipe = FP8T_PREC_DELAYED;
        pol.head_precision = FP8T_PREC_BF16;
        break;
    case FP8T_EVAL_FP32:
        pol.default_precision = FP8T_PREC_FP32;
        pol.head_precision = FP8T_PREC_FP32;
        break;
    default:
        pol.default_precision = FP8T_PREC_BF16;
        pol.head_precision = FP8T_PREC_BF16;
        break;
    }
    fp8t_model_set_policy(ev->m, &pol);
    ev->prec = p;
}

void fp8t_evaluator_fp8_state(fp8t_evaluator *ev, float *state, int *n, int *len) {
    fp8t_backend *be = fp8t_model_backend(ev->m);
    *n = fp8t_model_fp8_count(ev->m);
    *len = fp8t_model_fp8_history_len(ev->m);
    be->ops->to_host(be, state, fp8t_model_fp8_state(ev->m),
                     fp8t_recipe_state_floats(*n, *len) * sizeof(float));
}

int fp8t_evaluator_needs_calibration(fp8t_evaluator *ev) {
    int n = fp8t_model_fp8_count(ev->m), len = fp8t_model_fp8_history_len(ev->m);
    float *h = malloc(fp8t_recipe_state_floats(n, len) * sizeof(float));
    if (!h) return 0;
    fp8t_evaluator_fp8_state(ev, h, &n, &len);
    fp8t_recipe_state st;
    fp8t_recipe_state_view(&st, h, n, len);
    int empty = 1;
    for (int t = 0; t < n && empty; t++)
        if (t % 3 != FP8T_ROLE_DY && fp8t_recipe_history_max(&st, t) != 0.0f) empty = 0;
    free(h);
    return empty;
}

void fp8t_evaluator_calibrate(fp8t_evaluator *ev, const fp8t_data *d, int batches) {
    fp8t_eval_precision keep = ev->prec;
    fp8t_evaluator_set_precision(ev, FP8T_EVAL_BF16); /* amaxes are recorded in every precision */
    for (int i = 0; i < batches; i++) {
        fp8t_data_batch(d, ev->tokens, ev->targets, (uint64_t)i);
        fp8t_model_forward(ev->m, ev->tokens, NULL);
    }
    fp8t_model_end_step(ev->m); /* scale = 448 / amax, and the weight codes are remade */
    fp8t_evaluator_set_precision(ev, keep);
}

double fp8t_evaluator_batch_loss(fp8t_evaluator *ev, const int *tokens, const int *targets) {
    return (double)fp8t_model_forward(ev->m, tokens, targets);
}

double fp8t_evaluator_loss(fp8t_evaluator *ev, const fp8t_data *d, int batches) {
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        fp8t_data_batch(d, ev->tokens, ev->targets, (uint64_t)i);
        double l = fp8t_evaluator_batch_loss(ev, ev->tokens, ev->targets);
        if (isnan(l)) return NAN;
        sum += l;
    }
    return batches > 0 ? sum / batches : NAN;
}
