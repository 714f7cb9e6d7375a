/* Inspecting trained weights without training them: forward + backward passes with the tensor
 * inspector attached (no optimizer update, no scale update), the merged per-site table of the
 * stats they write. See include/fp8train/inspect_checkpoint.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fp8train/compare.h"
#include "fp8train/debug.h"
#include "fp8train/error.h"
#include "fp8train/inject.h"
#include "fp8train/inspect_checkpoint.h"
#include "fp8train/io.h"
#include "fp8train/recipe.h"

/* ---------------------------------------------------------------- one pass */

/* The instruments of one pass, in the trainer's order: the fault first (it changes what the
 * others see), NaN provenance, then statistics. */
typedef struct {
    fp8t_injector *inj;
    fp8t_nan_tracker *nan;
    fp8t_inspector *insp;
} pass_hooks;

static void pass_hook(void *ctx, fp8t_model *m, const fp8t_tensor_site *site, float *x) {
    pass_hooks *h = ctx;
    if (h->inj) fp8t_injector_observe(h->inj, m, site, x);
    fp8t_nan_tracker_observe(h->nan, m, site, x);
    fp8t_inspector_observe(h->insp, m, site, x);
}

/* Host copy of the evaluator's FP8 recipe state (malloc'd), NULL when out of memory. */
static float *save_fp8_state(fp8t_evaluator *ev, int *n, int *len) {
    fp8t_model *m = fp8t_evaluator_model(ev);
    size_t floats =
        fp8t_recipe_state_floats(fp8t_model_fp8_count(m), fp8t_model_fp8_history_len(m));
    float *st = malloc(floats * sizeof(float)); /* [(len + 3) * n] */
    if (st) fp8t_evaluator_fp8_state(ev, st, n, len);
    return st;
}

static void restore_fp8_state(fp8t_evaluator *ev, const float *st, int n, int len) {
    fp8t_model *m = fp8t_evaluator_model(ev);
    fp8t_backend *be = fp8t_model_backend(m);
    be->ops->to_device(be, fp8t_model_fp8_state(m), st,
                       fp8t_recipe_state_floats(n, len) * sizeof(float));
}

int fp8t_inspect_pass(fp8t_evaluator *ev, const fp8t_data *d, const fp8t_inspect_pass_cfg *cfg,
                      fp8t_inspect_pass_result *res, char *err, size_t errlen) {
    memset(res, 0, sizeof(*res));
    res->loss = NAN;
    if (!ev || !d || !cfg || !cfg->policy || !cfg->out_dir || cfg->batches < 1) {
        return fp8t_errorf(err, errlen,
                           "inspect pass: no evaluator, data, policy or output directory, or "
                           "no micro-batch to run");
    }
    pass_hooks h = {0};
    char e[FP8T_ERR_LEN];
    int rc = -1, n_st = 0, len_st = 0;
    const int B = fp8t_evaluator_B(ev), T = fp8t_evaluator_T(ev);
    int *tokens = malloc((size_t)B * T * sizeof(int));  /* [B, T] */
    int *targets = malloc((size_t)B * T * sizeof(int)); /* [B, T] */
    float *state = save_fp8_state(ev, &n_st, &len_st);
    fp8t_model *m = fp8t_evaluator_model(ev);
    const fp8t_eval_precision keep = fp8t_evaluator_precision(ev);
    if (!tokens || !targets || !state) {
        fp8t_errorf(err, errlen, "inspect pass: out of memory");
        goto done;
    }
    if (cfg->inject && cfg->inject[0] &&
        !(h.inj = fp8t_injector_create(cfg->inject, e, sizeof(e)))) {
        fp8t_errorf(err, errlen, "--inject: %s", e);
        goto done;
    }
    if (!(h.insp = fp8t_inspector_create(cfg->spec, cfg->out_dir, e, sizeof(e)))) {
        fp8t_errorf(err, errlen, "inspector: %s", e);
        goto done;
    }
    if (!(h.nan = fp8t_nan_tracker_create())) {
        fp8t_errorf(err, errlen, "inspect pass: out of memory");
        goto done;
    }

    fp8t_model_set_policy(m, cfg->policy);
    /* a fault may write a tensor between two sites that show it: then every site is read, and
     * the hook is a writing one; else it only reads (the model keeps its FP8 save of X) */
    fp8t_inspector_set_reuse(h.insp, h.inj == NULL);
    if (!h.inj && fp8t_inspector_reads_only(h.insp))
        fp8t_model_set_observer(m, pass_hook, &h);
    else
        fp8t_model_set_hook(m, pass_hook, &h);
    if (h.inj) fp8t_injector_begin_step(h.inj, cfg->step);
    fp8t_nan_tracker_begin_step(h.nan, cfg->step);
    fp8t_inspector_begin_step(h.insp, cfg->step);
    fp8t_model_zero_grad(m);
    double sum = 0;
    for (int i = 0; i < cfg->batches; i++) {
        fp8t_data_batch(d, tokens, targets, cfg->first_batch + (uint64_t)i);
        sum += fp8t_model_forward(m, tokens, targets);
        /* the gradients of the step these micro-batches would make (grad accumulation) */
        fp8t_model_backward(m, 1.0f / (float)cfg->batches);
    }
    fp8t_inspector_end_step(h.insp, cfg->step);
    fp8t_model_set_hook(m, NULL, NULL);
    res->batches = cfg->batches;
    res->loss = isfinite(sum) ? sum / cfg->batches : NAN;
    res->nonfinite =
        fp8t_nan_tracker_first(h.nan, res->first_nonfinite, sizeof(res->first_nonfinite));
    res->injected = h.inj ? fp8t_injector_fired(h.inj) : 0;
    /* the evaluator as it was: precision first (a policy change may convert dY scales), then
     * the recipe state, whose history slot 0 the pass's forwards have written into */
    fp8t_evaluator_set_precision(ev, keep);
    restore_fp8_state(ev, state, n_st, len_st);
    rc = 0;
done:
    fp8t_injector_destroy(h.inj);
    fp8t_nan_tracker_destroy(h.nan);
    fp8t_inspector_destroy(h.insp);
    free(tokens);
    free(targets);
    free(state);
    return rc;
}

int fp8t_inspect_calibrate(fp8t_evaluator *ev, const fp8t_data *d, uint64_t first_batch,
                           int batches) {
    if (batches < 1 || !fp8t_evaluator_needs_calibration(ev)) return 0;
    const int B = fp8t_evaluator_B(ev), T = fp8t_evaluator_T(ev);
    int *tokens = malloc((size_t)B * T * sizeof(int));  /* [B, T] */
    int *targets = malloc((size_t)B * T * sizeof(int)); /* [B, T] */
    if (!tokens || !targets) {
        free(tokens);
        free(targets);
        return 0;
    }
    fp8t_model *m = fp8t_evaluator_model(ev);
    const fp8t_eval_precision keep = fp8t_evaluator_precision(ev);
    fp8t_evaluator_set_precision(ev, FP8T_EVAL_BF16); /* amaxes are recorded in every precision */
    fp8t_model_zero_grad(m);
    for (int i = 0; i < batches; i++) {
        fp8t_data_batch(d, tokens, targets, first_batch + (uint64_t)i);
        fp8t_model_forward(m, tokens, targets);
        fp8t_model_backward(m, 1.0f / (float)batches);
    }
    fp8t_model_end_step(m); /* scale = fp8_max / amax for X, W and dY */
    fp8t_model_zero_grad(m);
    fp8t_evaluator_set_precision(ev, keep);
    free(tokens);
    free(targets);
    return 1;
}

/* ---------------------------------------------------------------- the output directory */

static int path_exists(const char *dir, const char *name) {
    char p[1200];
    struct stat st;
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

int fp8t_inspect_prepare_out(const char *dir, char *err, size_t errlen) {
    if (!dir || !*dir || strlen(dir) > 900) {
        return fp8t_errorf(err, errlen, "--out: needs a directory path (at most 900 characters)");
    }
    struct stat st;
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
        return fp8t_errorf(err, errlen, "--out %s: exists and is not a directory", dir);
    }
    if (path_exists(dir, "metrics.jsonl")) {
        return fp8t_errorf(
            err, errlen,
            "--out %s is a training run directory (it holds metrics.jsonl): its "
            "stats.jsonl and dumps would be replaced; choose another directory, e.g. "
            "%s/inspect",
            dir, dir);
    }
    if (!path_exists(dir, "inspect.json") &&
        (path_exists(dir, "stats.jsonl") || path_exists(dir, "dumps"))) {
        return fp8t_errorf(err, errlen,
                           "--out %s holds stats.jsonl or dumps/ that fp8train inspect did not "
                           "write (no inspect.json); choose an empty or new directory",
                           dir);
    }
    if (fp8t_mkdirs(dir, err, errlen)) return -1;
    /* an earlier inspection's outputs: stats.jsonl is appended to, and stale dumps of another
     * selection would be compared */
    static const char *const ours[] = {"stats.jsonl", "dumps", "bf16"};
    for (size_t i = 0; i < sizeof(ours) / sizeof(ours[0]); i++) {
        char p[1200];
        snprintf(p, sizeof(p), "%s/%s", dir, ours[i]);
        if (fp8t_rmtree(p) != 0) {
            return fp8t_errorf(err, errlen,
                               "--out: cannot remove %s of an earlier inspection: %s", p,
                               strerror(errno));
        }
    }
    char marker[1200];
    snprintf(marker, sizeof(marker), "%s/inspect.json", dir);
    static const char text[] = "{\"command\": \"inspect\", \"complete\": false}\n";
    return fp8t_write_file_atomic(marker, text, sizeof(text) - 1, err, errlen);
}

/* ---------------------------------------------------------------- the per-site table */

static int module_rank(const char *s) {
    fp8t_module m;
    return fp8t_module_parse(&m, s) == 0 ? (int)m : FP8T_MOD_COUNT;
}

static int gemm_rank(const char *s) {
    for (int g = 0; g < FP8T_GEMM_COUNT; g++)
        if (!strcmp(s, fp8t_gemm_name((fp8t_gemm_kind)g))) return g;
    return FP8T_GEMM_COUNT;
}

static int tensor_rank(const char *s) {
    for (int k = 0; k < FP8T_T_COUNT; k++)
        if (!strcmp(s, fp8t_tensor_kind_name((fp8t_tensor_kind)k))) return k;
    return FP8T_T_COUNT;
}

static int cmp3(int a, int b) { return (a > b) - (a < b); }

/* Model order: layers ascending with the head (-1) last, then module, GEMM, tensor. */
static int cmp_row_site(const void *pa, const void *pb) {
    const fp8t_stat_row *a = pa, *b = pb;
    int la = a->layer < 0 ? 1 << 30 : a->layer, lb = b->layer < 0 ? 1 << 30 : b->layer;
    int c;
    if ((c = cmp3(la, lb))) return c;
    if ((c = cmp3(module_rank(a->module), module_rank(b->module)))) return c;
    if ((c = strcmp(a->module, b->module))) return c;
    if ((c = cmp3(gemm_rank(a->gemm), gemm_rank(b->gemm)))) return c;
    if ((c = cmp3(tensor_rank(a->tensor), tensor_rank(b->tensor)))) return c;
    return cmp3(a->micro, b->micro);
}

static int same_site(const fp8t_stat_row *a, const fp8t_stat_row *b) {
    return a->layer == b->layer && !strcmp(a->module, b->module) && !strcmp(a->gemm, b->gemm) &&
           !strcmp(a->tensor, b->tensor);
}

static int is_quantized(const char *precision) {
    return precision[0] && strcmp(precision, "bf16") != 0 && strcmp(precision, "fp32") != 0;
}

/* max / min that let a NaN (a result's missing error statistic) lose to any number */
static double max_nan(double a, double b) { return isnan(a) ? b : (b > a ? b : a); }
static double min_nan(double a, double b) { return isnan(a) ? b : (b < a ? b : a); }

static double finite_or_zero(double x) { return isfinite(x) ? x : 0.0; }

int fp8t_inspect_sites_read(fp8t_inspect_site **sites, int *n, const char *stats_path, int step,
                            double cosine_flag, char *err, size_t errlen) {
    *sites = NULL;
    *n = 0;
    fp8t_stat_row *rows;
    int nr;
    if (fp8t_stats_read(&rows, &nr, stats_path, err, errlen)) return -1;
    int m = 0;
    for (int i = 0; i < nr; i++)
        if (step < 0 || rows[i].step == step) rows[m++] = rows[i];
    /* rows is NULL when the file had none */
    if (m > 1) qsort(rows, (size_t)m, sizeof(fp8t_stat_row), cmp_row_site);
    fp8t_inspect_site *out = calloc((size_t)m + 1, sizeof(fp8t_inspect_site));
    if (!out) {
        free(rows);
        return fp8t_errorf(err, errlen, "%s: out of memory", stats_path);
    }
    int k = 0;
    for (int i = 0; i < m; i++) {
        const fp8t_stat_row *r = &rows[i];
        if (k == 0 || !same_site(r, &rows[i - 1])) {
            fp8t_inspect_site *s = &out[k++];
            s->layer = r->layer;
            memcpy(s->module, r->module, sizeof(s->module));
            memcpy(s->gemm, r->gemm, sizeof(s->gemm));
            memcpy(s->tensor, r->tensor, sizeof(s->tensor));
            memcpy(s->precision, r->precision, sizeof(s->precision));
            s->is_operand = r->is_operand;
            s->quantized = r->is_operand && is_quantized(r->precision);
            s->scale = r->scale;
            s->amax = s->underflow_pct = s->saturation_pct = s->sqnr_db = s->cosine = NAN;
        }
        fp8t_inspect_site *s = &out[k - 1];
        s->n++;
        s->amax = max_nan(s->amax, r->amax);
        s->underflow_pct = max_nan(s->underflow_pct, r->underflow_pct);
        s->saturation_pct = max_nan(s->saturation_pct, r->saturation_pct);
        s->sqnr_db = min_nan(s->sqnr_db, r->sqnr_db);
        s->cosine = min_nan(s->cosine, r->cosine);
        s->nonfinite += finite_or_zero(r->n_nan) + finite_or_zero(r->n_inf);
    }
    for (int i = 0; i < k; i++) {
        fp8t_inspect_site *s = &out[i];
        /* a quantized operand with no cosine held nothing finite to compare: as bad as it gets */
        s->flagged = s->nonfinite > 0 || (s->quantized && !(s->cosine >= cosine_flag));
    }
    free(rows);
    *sites = out;
    *n = k;
    return 0;
}
