/* compare output: the human-readable summary with its tables, and the same as JSON. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "fp8train/compare.h"

static void site_label(char *buf, size_t len, int layer, const char *module, const char *gemm,
                       const char *tensor) {
    if (layer < 0)
        snprintf(buf, len, "head %s %s", gemm, tensor);
    else
        snprintf(buf, len, "L%d %s %s %s", layer, module, gemm, tensor);
}

/* "block128_e4m3 38.2dB (B)": the what-if recipe with the best mean SQNR, or "-" */
static void whatif_label(char *buf, size_t len, const fp8t_site_diff *d) {
    if (!d->whatif_run || d->whatif_best < 0) {
        snprintf(buf, len, "-");
        return;
    }
    snprintf(buf, len, "%s %.1fdB, %.3f%% uflow (%c)", fp8t_whatif_names[d->whatif_best],
             d->whatif_sqnr[d->whatif_best], d->whatif_under[d->whatif_best], d->whatif_run);
}

/* "A 12.3dB/0.410% B 18.0dB/0.000%": the worst block / rowwise tile of each run that has tile
 * data (its mean SQNR over the steps, its largest underflow), or "" when neither has any */
static void tile_label(char *buf, size_t len, const fp8t_site_diff *d) {
    size_t k = 0;
    buf[0] = 0;
    if (!isnan(d->tile_sqnr_a))
        k += (size_t)snprintf(buf + k, len - k, "A %.1fdB/%.3f%%", d->tile_sqnr_a,
                              d->tile_under_a);
    if (!isnan(d->tile_sqnr_b) && k < len)
        snprintf(buf + k, len - k, "%sB %.1fdB/%.3f%%", k ? " " : "", d->tile_sqnr_b,
                 d->tile_under_b);
}

static int any_tiles(const fp8t_compare_result *r) {
    for (int i = 0; i < r->n_sites; i++)
        if (!isnan(r->sites[i].tile_sqnr_a) || !isnan(r->sites[i].tile_sqnr_b)) return 1;
    return 0;
}

void fp8t_compare_print(FILE *f, const fp8t_run *a, const fp8t_run *b,
                        const fp8t_compare_result *r) {
    fprintf(f, "A (baseline): %s  [%s]\n", a->label, a->metrics_path);
    fprintf(f, "B (test):     %s  [%s]\n", b->label, b->metrics_path);
    fprintf(f, "aligned: %d steps (%d..%d); gap = (loss_B - loss_A) / |loss_A|\n", r->n,
            r->steps[0], r->steps[r->n - 1]);
    fprintf(f,
            "gap: mean |gap| %.3f%%  max %.3f%% (step %d)  early %.3f%%  end %+.3f%%  "
            "trend %+.2e/step  noise %.2f%%/step",
            100 * r->mean_abs_gap, 100 * r->max_abs_gap, r->max_gap_step, 100 * r->early_gap,
            100 * r->late_gap, r->trend, 100 * r->gap_noise);
    if (isfinite(r->val_gap))
        fprintf(f, "  val %+.3f%% (step %d)", 100 * r->val_gap, r->val_step);
    fprintf(f, "\n");
    if (r->noise_from_run) {
        fprintf(f,
                "noise: +-%.3f%% (largest smoothed gap of the noise run %s against A over the "
                "second half)",
                100 * r->noise, r->noise_label);
        if (isfinite(r->noise_val_gap))
            fprintf(f, "; its val gap %+.3f%%", 100 * r->noise_val_gap);
        fprintf(f, "\n");
    } else {
        fprintf(f,
                "noise: +-%.3f%% (estimated: 2 x the gap's step-to-step spread; measure it with "
                "--noise-run, a second baseline seed)\n",
                100 * r->noise);
    }
    fprintf(f, "\nverdict: %s\n", r->verdict);
    fprintf(f, "next:    %s\n", r->advice);
    for (int i = 0; i < r->n_notes; i++) fprintf(f, "note:    %s\n", r->notes[i]);
    if (r->n_spikes) {
        fprintf(f, "\nspikes:\n  %-4s %8s %9s %7s %10s  %s\n", "run", "step", "size", "z",
                "recovery", "");
        for (int i = 0; i < r->n_spikes; i++) {
            const fp8t_spike_report *s = &r->spikes[i];
            char rec[24];
            if (s->recovery_steps < 0)
                snprintf(rec, sizeof(rec), "never");
            else
                snprintf(rec, sizeof(rec), "%d", s->recovery_steps);
            fprintf(f, "  %-4c %8d %+8.1f%% %7.1f %10s  %s%s\n", 'A' + s->run, s->step,
                    100 * s->size_rel, s->zscore, rec, s->slow ? "slow" : "fast",
                    s->in_other_run ? ", in both runs" : "");
        }
    }
    if (r->have_stats == 2) {
        fprintf(
            f, "\ntensors whose FP8 error differs most (mean over %s steps inspected in both):\n",
            "the");
        fprintf(f, "  %-28s %9s %9s %10s %10s %8s %8s  %s\n", "site", "SQNR A", "SQNR B", "cos A",
                "cos B", "uflow A", "uflow B", "best what-if recipe");
        for (int i = 0; i < r->n_sites; i++) {
            const fp8t_site_diff *d = &r->sites[i];
            char name[64], wi[96];
            site_label(name, sizeof(name), d->layer, d->module, d->gemm, d->tensor);
            whatif_label(wi, sizeof(wi), d);
            fprintf(f, "  %-28s %8.1fdB %8.1fdB %10.6f %10.6f %7.3f%% %7.3f%%  %s\n", name,
                    d->sqnr_a, d->sqnr_b, d->cos_a, d->cos_b, d->under_a, d->under_b, wi);
        }
    } else if (r->have_stats == 1) {
        int in_a = a->n_stats > 0;
        fprintf(f, "\ntensors with the largest FP8 error in run %c (only it was inspected):\n",
                in_a ? 'A' : 'B');
        fprintf(f, "  %-28s %9s %10s %8s  %s\n", "site", "SQNR", "cosine", "uflow",
                "best what-if recipe");
        for (int i = 0; i < r->n_sites; i++) {
            const fp8t_site_diff *d = &r->sites[i];
            char name[64], wi[96];
            site_label(name, sizeof(name), d->layer, d->module, d->gemm, d->tensor);
            whatif_label(wi, sizeof(wi), d);
            fprintf(f, "  %-28s %8.1fdB %10.6f %7.3f%%  %s\n", name, in_a ? d->sqnr_a : d->sqnr_b,
                    in_a ? d->cos_a : d->cos_b, in_a ? d->under_a : d->under_b, wi);
        }
    }
    if (r->have_stats && any_tiles(r)) {
        fprintf(f, "\nworst block / rowwise tile of those tensors (each tile of the GEMM's own "
                   "scaling on its own; mean SQNR of the worst tile / its largest underflow):\n");
        for (int i = 0; i < r->n_sites; i++) {
            const fp8t_site_diff *d = &r->sites[i];
            char name[64], t[96];
            tile_label(t, sizeof(t), d);
            if (!t[0]) continue;
            site_label(name, sizeof(name), d->layer, d->module, d->gemm, d->tensor);
            fprintf(f, "  %-28s %s\n", name, t);
        }
    }
    if (r->n_dumps) {
        fprintf(f, "\ndumped tensors, B against A (%d compared, %d with cosine < 0.99):\n",
                r->n_dumps, r->n_dumps_flagged);
        fprintf(f, "  %8s  %-32s %12s %12s %10s\n", "step", "tensor", "cosine", "rel L2", "SQNR");
        int shown = 0;
        for (int i = 0; i < r->n_dumps && shown < 20; i++, shown++) {
            const fp8t_dump_diff *d = &r->dumps[i];
            fprintf(f, "  %8d  %-32s %12.6f %12.3e %8.1fdB%s\n", d->step, d->name, d->cosine,
                    d->rel_l2, d->sqnr_db > 1e299 ? INFINITY : d->sqnr_db,
                    d->flagged ? "  <- quantization error too large" : "");
        }
        if (r->n_dumps > shown) fprintf(f, "  ... %d more\n", r->n_dumps - shown);
    }
    if (r->dump_note[0]) fprintf(f, "dumps: %s\n", r->dump_note);
}

static cJSON *num_or_null(double x) {
    return isfinite(x) ? cJSON_CreateNumber(x) : cJSON_CreateNull();
}

char *fp8t_compare_to_json(const fp8t_run *a, const fp8t_run *b, const fp8t_compare_result *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "class", fp8t_compare_class_name(r->cls));
    cJSON_AddNumberToObject(o, "exit_code", fp8t_compare_exit_code(r));
    cJSON_AddStringToObject(o, "verdict", r->verdict);
    cJSON_AddStringToObject(o, "advice", r->advice);
    cJSON_AddStringToObject(o, "run_a", a->metrics_path);
    cJSON_AddStringToObject(o, "run_b", b->metrics_path);
    cJSON_AddNumberToObject(o, "threshold", r->threshold);
    cJSON_AddNumberToObject(o, "aligned_steps", r->n);
    cJSON_AddNumberToObject(o, "first_step", r->steps[0]);
    cJSON_AddNumberToObject(o, "last_step", r->steps[r->n - 1]);
    cJSON_AddItemToObject(o, "mean_abs_gap", num_or_null(r->mean_abs_gap));
    cJSON_AddItemToObject(o, "max_abs_gap", num_or_null(r->max_abs_gap));
    cJSON_AddNumberToObject(o, "max_gap_step", r->max_gap_step);
    cJSON_AddItemToObject(o, "early_gap", num_or_null(r->early_gap));
    cJSON_AddItemToObject(o, "end_gap", num_or_null(r->late_gap));
    cJSON_AddItemToObject(o, "trend_per_step", num_or_null(r->trend));
    cJSON_AddItemToObject(o, "gap_noise", num_or_null(r->gap_noise));
    cJSON_AddItemToObject(o, "noise", num_or_null(r->noise));
    cJSON_AddStringToObject(o, "noise_source", r->noise_from_run ? "noise_run" : "step_spread");
    if (r->noise_from_run) {
        cJSON_AddStringToObject(o, "noise_run", r->noise_label);
        cJSON_AddItemToObject(o, "noise_val_gap", num_or_null(r->noise_val_gap));
    }
    cJSON_AddNumberToObject(o, "drift_step", r->drift_step);
    cJSON_AddItemToObject(o, "val_gap", num_or_null(r->val_gap));
    cJSON_AddNumberToObject(o, "smoothing_window", r->window);
    if (r->nan_run >= 0) {
        cJSON *n = cJSON_AddObjectToObject(o, "nan");
        cJSON_AddStringToObject(n, "run", r->nan_run ? "B" : "A");
        cJSON_AddNumberToObject(n, "step", r->nan_step);
        cJSON_AddStringToObject(n, "where", r->nan_where);
    }
    cJSON *sp = cJSON_AddArrayToObject(o, "spikes");
    for (int i = 0; i < r->n_spikes; i++) {
        const fp8t_spike_report *s = &r->spikes[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "run", s->run ? "B" : "A");
        cJSON_AddNumberToObject(e, "step", s->step);
        cJSON_AddItemToObject(e, "size_rel", num_or_null(s->size_rel));
        cJSON_AddItemToObject(e, "zscore", num_or_null(s->zscore));
        cJSON_AddNumberToObject(e, "recovery_steps", s->recovery_steps);
        cJSON_AddBoolToObject(e, "slow", s->slow);
        cJSON_AddBoolToObject(e, "in_both_runs", s->in_other_run);
        cJSON_AddItemToArray(sp, e);
    }
    cJSON *st = cJSON_AddArrayToObject(o, "tensors");
    for (int i = 0; i < r->n_sites; i++) {
        const fp8t_site_diff *d = &r->sites[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "layer", d->layer);
        cJSON_AddStringToObject(e, "module", d->module);
        cJSON_AddStringToObject(e, "gemm", d->gemm);
        cJSON_AddStringToObject(e, "tensor", d->tensor);
        cJSON_AddItemToObject(e, "sqnr_a", num_or_null(d->sqnr_a));
        cJSON_AddItemToObject(e, "sqnr_b", num_or_null(d->sqnr_b));
        cJSON_AddItemToObject(e, "cosine_a", num_or_null(d->cos_a));
        cJSON_AddItemToObject(e, "cosine_b", num_or_null(d->cos_b));
        cJSON_AddItemToObject(e, "underflow_pct_a", num_or_null(d->under_a));
        cJSON_AddItemToObject(e, "underflow_pct_b", num_or_null(d->under_b));
        if (!isnan(d->tile_sqnr_a) || !isnan(d->tile_sqnr_b)) {
            cJSON_AddItemToObject(e, "tile_sqnr_min_db_a", num_or_null(d->tile_sqnr_a));
            cJSON_AddItemToObject(e, "tile_sqnr_min_db_b", num_or_null(d->tile_sqnr_b));
            cJSON_AddItemToObject(e, "tile_underflow_max_pct_a", num_or_null(d->tile_under_a));
            cJSON_AddItemToObject(e, "tile_underflow_max_pct_b", num_or_null(d->tile_under_b));
        }
        if (d->whatif_run) {
            char run[2] = {d->whatif_run, 0};
            cJSON_AddStringToObject(e, "whatif_run", run);
            cJSON_AddStringToObject(e, "precision", d->precision);
            cJSON *w = cJSON_AddObjectToObject(e, "whatif");
            for (int k = 0; k < FP8T_WHATIF_COUNT; k++) {
                cJSON *o1 = cJSON_AddObjectToObject(w, fp8t_whatif_names[k]);
                cJSON_AddItemToObject(o1, "sqnr_db", num_or_null(d->whatif_sqnr[k]));
                cJSON_AddItemToObject(o1, "underflow_pct", num_or_null(d->whatif_under[k]));
            }
            if (d->whatif_best >= 0)
                cJSON_AddStringToObject(e, "whatif_best", fp8t_whatif_names[d->whatif_best]);
        }
        cJSON_AddItemToArray(st, e);
    }
    cJSON *du = cJSON_AddArrayToObject(o, "dumps");
    for (int i = 0; i < r->n_dumps; i++) {
        const fp8t_dump_diff *d = &r->dumps[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "step", d->step);
        cJSON_AddStringToObject(e, "tensor", d->name);
        cJSON_AddItemToObject(e, "cosine", num_or_null(d->cosine));
        cJSON_AddItemToObject(e, "rel_l2", num_or_null(d->rel_l2));
        cJSON_AddItemToObject(e, "sqnr_db", num_or_null(d->sqnr_db));
        cJSON_AddBoolToObject(e, "flagged", d->flagged);
        cJSON_AddItemToArray(du, e);
    }
    cJSON *nt = cJSON_AddArrayToObject(o, "notes");
    for (int i = 0; i < r->n_notes; i++)
        cJSON_AddItemToArray(nt, cJSON_CreateString(r->notes[i]));
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}
