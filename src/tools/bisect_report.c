/* bisect's output: the evidence table on a terminal, OUT/bisect/bisect.json (the summary a
 * script reads) and OUT/bisect/report.html (one self-contained page: conclusion, evidence
 * table, loss curves of every experiment). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "tools/bisect_internal.h"
#include "fp8train/compare.h"
#include "fp8train/error.h"
#include "fp8train/policy_json.h"

static const char *outcome_name(fp8t_bisect_outcome o) {
    return o == FP8T_BISECT_NO_PROBLEM ? "no_problem"
           : o == FP8T_BISECT_FOUND    ? "found"
                                       : "no_fix";
}

static cJSON *num_or_null(double v) {
    return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}
static cJSON *tristate(int v) { return v < 0 ? cJSON_CreateNull() : cJSON_CreateBool(v); }

/* --threshold to suggest against a noise: 2x the noise rounded up to two significant digits
 * (0.0614 -> 0.13), so gaps that pass it cannot be noise alone. */
static double threshold_for_noise(double noise) {
    double v = 2 * noise;
    double step = pow(10, floor(log10(v)) - 1);
    return ceil(v / step - 1e-6) * step;
}

/* The WARNING paragraph of a bisect whose noise (fp8t_bisect_noise) exceeds the threshold,
 * lines ending in '\n'; "" and 0 when the result is reliable. */
static int noise_warning(char *buf, size_t len, const fp8t_bisect_result *res, double threshold) {
    int which;
    double noise = fp8t_bisect_noise(res, &which);
    buf[0] = 0;
    if (!(noise > threshold) || which < 0) return 0;
    double suggest = threshold_for_noise(noise);
    char fix[96];
    if (suggest < 1)
        snprintf(fix, sizeof fix, "--threshold %g or more", suggest);
    else
        snprintf(fix, sizeof fix, "(no --threshold under 1 is above 2x this noise)");
    snprintf(buf, len,
             "WARNING: unreliable, these experiments are too noisy to trust: %s ends %.3g%% "
             "BELOW the BF16 baseline (gap %+.3g%%).\n"
             "  It only adds FP8 rounding to the BF16 run, and rounding does not make training "
             "better by that much:\n"
             "  runs that differ only by rounding spread by about \u00b1%.3g%% here, so gaps "
             "under ~%.3g%% (2x the noise)\n"
             "  cannot be told apart from noise (threshold %.3g%%). The conclusion below is an "
             "UNCONFIRMED best guess.\n"
             "  For a trustworthy answer: a calmer setup (lower --lr, longer --warmup, or "
             "--resume from a checkpoint\n"
             "  past the unstable phase), more --steps, or %s.\n",
             res->exp[which].name, 100 * noise, 100 * res->exp[which].gap, 100 * noise,
             200 * noise, 100 * threshold, fix);
    return 1;
}

static int write_text(bisect_ctx *c, const char *path, const char *text) {
    char tmp[BPATH];
    snprintf(tmp, sizeof tmp, "%.*s.tmp", FP8T_PATH_MAX + 256, path);
    FILE *f = fopen(tmp, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
        fp8t_errorf(c->err, c->errlen, "bisect: cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* OUT/bisect/bisect.json: the experiments, the verdict and the override. */
int bisect_write_json(bisect_ctx *c) {
    const fp8t_bisect_result *res = c->res;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "outcome", outcome_name(res->outcome));
    cJSON_AddStringToObject(root, "conclusion", res->conclusion);
    cJSON_AddNumberToObject(root, "threshold", c->cfg->threshold);
    cJSON_AddNumberToObject(root, "steps", c->cfg->steps);
    cJSON_AddNumberToObject(root, "start_step", c->start_step);
    cJSON_AddStringToObject(root, "resume", c->cfg->train.resume);
    cJSON_AddStringToObject(root, "inject", c->cfg->train.inject);
    char *pol = fp8t_policy_to_json(&c->cfg->train.policy);
    cJSON *pj = pol ? cJSON_Parse(pol) : NULL;
    free(pol);
    cJSON_AddItemToObject(root, "policy", pj ? pj : cJSON_CreateNull());
    cJSON_AddItemToObject(root, "baseline_loss", num_or_null(res->baseline_loss));
    cJSON_AddItemToObject(root, "fp8_gap", num_or_null(res->fp8_gap));
    cJSON_AddItemToObject(root, "recovered", tristate(res->recovered));
    cJSON_AddItemToObject(root, "fake_matches", tristate(res->fake_matches));
    /* the noise judgement (fp8t_bisect_noise): reliable false = the culprit is unconfirmed */
    {
        int which;
        double noise = fp8t_bisect_noise(res, &which);
        char warning[1024];
        int warn = noise_warning(warning, sizeof warning, res, c->cfg->threshold);
        cJSON_AddNumberToObject(root, "noise", noise);
        cJSON_AddBoolToObject(root, "reliable", !warn);
        if (which >= 0)
            cJSON_AddStringToObject(root, "noise_experiment", res->exp[which].name);
        else
            cJSON_AddNullToObject(root, "noise_experiment");
        if (warn)
            cJSON_AddStringToObject(root, "warning", warning);
        else
            cJSON_AddNullToObject(root, "warning");
    }
    if (res->culprit_gemms) {
        cJSON *cu = cJSON_AddObjectToObject(root, "culprit");
        cJSON *g = cJSON_AddArrayToObject(cu, "gemms");
        for (int k = 0; k < FP8T_GEMM_COUNT; k++)
            if (res->culprit_gemms & (1u << k))
                cJSON_AddItemToArray(g, cJSON_CreateString(fp8t_gemm_name((fp8t_gemm_kind)k)));
        /* transformer layers of the culprit span (null when it is the head alone) */
        int last = res->layer_hi < c->n_layer ? res->layer_hi : c->n_layer - 1;
        if (res->layer_lo < c->n_layer) {
            int lr[2] = {res->layer_lo, last};
            cJSON_AddItemToObject(cu, "layers", cJSON_CreateIntArray(lr, 2));
        } else {
            cJSON_AddNullToObject(cu, "layers");
        }
        cJSON_AddBoolToObject(cu, "head", res->layer_hi >= c->n_layer);
        char words[96];
        bisect_span_words(words, sizeof words, c->n_layer, res->layer_lo, res->layer_hi);
        cJSON_AddStringToObject(cu, "where", words);
    } else {
        cJSON_AddNullToObject(root, "culprit");
    }
    if (res->outcome == FP8T_BISECT_FOUND) {
        cJSON *fx = cJSON_AddObjectToObject(root, "fix");
        cJSON_AddStringToObject(fx, "precision", fp8t_precision_name(res->fix_precision));
        cJSON_AddStringToObject(fx, "override", res->override);
        cJSON_AddItemToObject(fx, "gap", num_or_null(res->fix_gap));
        cJSON_AddStringToObject(fx, "alternatives", res->alternatives);
    } else {
        cJSON_AddNullToObject(root, "fix");
    }
    cJSON *arr = cJSON_AddArrayToObject(root, "experiments");
    for (int i = 0; i < res->n_exp; i++) {
        const fp8t_bisect_exp *e = &res->exp[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", e->name);
        cJSON_AddStringToObject(o, "what", e->what);
        cJSON_AddStringToObject(o, "override", e->override);
        cJSON_AddStringToObject(o, "stop",
                                e->stop == FP8T_STOP_DONE  ? "done"
                                : e->stop == FP8T_STOP_NAN ? "nan"
                                                           : "error");
        cJSON_AddNumberToObject(o, "first_step", e->first_step);
        cJSON_AddNumberToObject(o, "last_step", e->last_step);
        cJSON_AddItemToObject(o, "final_loss", num_or_null(e->final_loss));
        cJSON_AddItemToObject(o, "tail_loss", num_or_null(e->tail_loss));
        cJSON_AddItemToObject(o, "gap", num_or_null(e->gap));
        cJSON_AddBoolToObject(o, "closes", e->closes);
        cJSON_AddNumberToObject(o, "seconds", e->seconds);
        cJSON_AddStringToObject(o, "verdict", e->verdict);
        cJSON_AddItemToArray(arr, o);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) {
        fp8t_errorf(c->err, c->errlen, "bisect: out of memory");
        return -1;
    }
    char path[BPATH];
    snprintf(path, sizeof path, "%s/bisect.json", c->root);
    size_t len = strlen(text);
    char *withnl = malloc(len + 2);
    if (withnl) memcpy(withnl, text, len), withnl[len] = '\n', withnl[len + 1] = 0;
    int rc = write_text(c, path, withnl ? withnl : text);
    free(withnl);
    free(text);
    return rc;
}

static void html_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* One polyline per experiment over the steps: the baseline black, plain FP8 red, the fix
 * green, the rest grey. */
static void html_chart(FILE *f, bisect_ctx *c) {
    const fp8t_bisect_result *res = c->res;
    enum { W = 860, H = 320, PAD = 48 };
    fp8t_metric_row *rows[FP8T_BISECT_MAX_EXP] = {0};
    int nrows[FP8T_BISECT_MAX_EXP] = {0};
    double ymin = INFINITY, ymax = -INFINITY;
    int xmin = c->start_step, xmax = c->start_step + c->cfg->steps;
    for (int i = 0; i < res->n_exp; i++) {
        char path[BPATH], err[256];
        snprintf(path, sizeof path, "%s/%s/metrics.jsonl", c->root, res->exp[i].name);
        if (!res->exp[i].ran || fp8t_metrics_read(&rows[i], &nrows[i], path, err, sizeof err))
            continue;
        for (int k = 0; k < nrows[i]; k++) {
            double y = rows[i][k].loss;
            /* the first few steps dwarf the rest; scale to what follows them */
            if (!rows[i][k].has_loss || !isfinite(y) ||
                rows[i][k].step < xmin + c->cfg->steps / 10)
                continue;
            if (y < ymin) ymin = y;
            if (y > ymax) ymax = y;
        }
    }
    if (!(ymax > ymin)) ymax = ymin + 1;
    double pad = 0.05 * (ymax - ymin);
    ymin -= pad, ymax += pad;
    fprintf(f,
            "<svg width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "xmlns=\"http://www.w3.org/2000/svg\" style=\"background:#fff\">\n",
            W, H, W, H);
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
            "stroke=\"#999\"/>\n",
            PAD, 10, W - PAD - 10, H - PAD - 10);
    fprintf(f,
            "<text x=\"4\" y=\"18\" font-size=\"11\">%.3f</text>"
            "<text x=\"4\" y=\"%d\" font-size=\"11\">%.3f</text>"
            "<text x=\"%d\" y=\"%d\" font-size=\"11\">step %d</text>"
            "<text x=\"%d\" y=\"%d\" font-size=\"11\" text-anchor=\"end\">step %d</text>\n",
            ymax, H - PAD, ymin, PAD, H - PAD + 16, xmin, W - 10, H - PAD + 16, xmax);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < res->n_exp; i++) {
            if (!rows[i]) continue;
            const fp8t_bisect_exp *e = &res->exp[i];
            const char *color = "#bbb";
            int width = 1, fix = res->override[0] && strcmp(e->override, res->override) == 0;
            if (strcmp(e->name, "bf16") == 0)
                color = "#000", width = 2;
            else if (strcmp(e->name, "fp8") == 0)
                color = "#d62728", width = 2;
            else if (fix)
                color = "#2ca02c", width = 2;
            if ((width == 2) != (pass == 1)) continue; /* highlighted lines on top */
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%d\" points=\"",
                    color, width);
            for (int k = 0; k < nrows[i]; k++) {
                const fp8t_metric_row *r = &rows[i][k];
                if (!r->has_loss || !isfinite(r->loss) || r->step < xmin) continue;
                double y = r->loss < ymin ? ymin : r->loss > ymax ? ymax : r->loss;
                double px = PAD + (double)(r->step - xmin) / (xmax - xmin > 0 ? xmax - xmin : 1) *
                                      (W - PAD - 10);
                double py = 10 + (ymax - y) / (ymax - ymin) * (H - PAD - 10);
                fprintf(f, "%.1f,%.1f ", px, py);
            }
            fprintf(f, "\"><title>");
            html_escape(f, e->name);
            fprintf(f, "</title></polyline>\n");
        }
    }
    fprintf(f, "</svg>\n<p class=\"legend\"><span style=\"color:#000\">&#9632; bf16</span> "
               "<span style=\"color:#d62728\">&#9632; fp8</span> "
               "<span style=\"color:#2ca02c\">&#9632; the fix</span> "
               "<span style=\"color:#999\">&#9632; other experiments</span> "
               "(training loss; hover a line for its name)</p>\n");
    for (int i = 0; i < res->n_exp; i++) free(rows[i]);
}

/* OUT/bisect/report.html: conclusion, evidence table, loss curves. Self-contained. */
int bisect_write_html(bisect_ctx *c) {
    const fp8t_bisect_result *res = c->res;
    char path[BPATH], tmp[BPATH];
    snprintf(path, sizeof path, "%s/report.html", c->root);
    snprintf(tmp, sizeof tmp, "%.*s.tmp", FP8T_PATH_MAX + 256, path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fp8t_errorf(c->err, c->errlen, "bisect: cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    fprintf(f, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>fp8train bisect"
               "</title>\n<style>body{font-family:sans-serif;margin:24px;max-width:1000px}"
               "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;"
               "font-size:13px}th{background:#f3f3f3}tr.ok td{background:#eefbea}"
               "tr.bad td{background:#fdeeee}td.num{text-align:right;font-family:monospace}"
               "pre{background:#f6f6f6;padding:10px}code{background:#f6f6f6}"
               "td code{white-space:nowrap}.legend{font-size:12px}"
               ".warn{border:2px solid #d62728;background:#fff4e5;padding:8px 14px;"
               "margin:12px 0}.warn pre{background:none;white-space:pre-wrap;padding:0}"
               "</style></head><body>\n<h1>FP8 bisection</h1>\n");
    char warning[1024];
    int warn = noise_warning(warning, sizeof warning, res, c->cfg->threshold);
    if (warn) {
        fprintf(f, "<div class=\"warn\" id=\"noise-warning\"><pre>");
        html_escape(f, warning);
        fprintf(f, "</pre></div>\n");
    }
    fprintf(f,
            "<p>%d steps per experiment from %s. Tail loss: the mean training loss of the "
            "last %d steps; gap: the median over those steps of the relative loss "
            "difference against the BF16 baseline on the same batch (a median, so one "
            "hard batch does not decide); threshold %.2f%%.",
            c->cfg->steps, c->start_step ? "a checkpoint" : "a fresh init", res->tail_steps,
            100 * c->cfg->threshold);
    if (c->cfg->train.inject[0]) {
        fprintf(f, " Injected fault: <code>");
        html_escape(f, c->cfg->train.inject);
        fprintf(f, "</code>.");
    }
    fprintf(f, "</p>\n<h2>Conclusion: %s%s</h2>\n<pre>", outcome_name(res->outcome),
            warn ? " (UNCONFIRMED: within the noise, see the warning above)" : "");
    html_escape(f, res->conclusion);
    fprintf(f, "</pre>\n<h2>Evidence</h2>\n<table><tr><th>#</th><th>experiment</th>"
               "<th>what</th><th>override</th><th>final loss</th><th>tail loss</th>"
               "<th>gap</th><th>time</th><th>verdict</th></tr>\n");
    for (int i = 0; i < res->n_exp; i++) {
        const fp8t_bisect_exp *e = &res->exp[i];
        int is_base = strcmp(e->name, "bf16") == 0;
        fprintf(f, "<tr class=\"%s\"><td>%d</td><td><a href=\"%s/metrics.jsonl\">",
                is_base     ? ""
                : e->closes ? "ok"
                            : "bad",
                i + 1, e->name);
        html_escape(f, e->name);
        fprintf(f, "</a></td><td>");
        html_escape(f, e->what);
        fprintf(f, "</td><td><code>");
        html_escape(f, e->override);
        fprintf(f, "</code></td><td class=\"num\">%.4f</td><td class=\"num\">%.4f</td>",
                e->final_loss, e->tail_loss);
        if (isfinite(e->gap))
            fprintf(f, "<td class=\"num\">%+.2f%%</td>", 100 * e->gap);
        else
            fprintf(f, "<td class=\"num\">inf</td>");
        fprintf(f, "<td class=\"num\">%.1fs</td><td>", e->seconds);
        html_escape(f, e->verdict);
        fprintf(f, "</td></tr>\n");
    }
    fprintf(f, "</table>\n<h2>Loss curves</h2>\n");
    html_chart(f, c);
    fprintf(f, "<p>Each experiment is a run directory next to this file "
               "(<code>metrics.jsonl</code>, <code>events.jsonl</code>, checkpoints); "
               "<code>bisect.json</code> holds this summary. Compare any two with "
               "<code>fp8train compare bf16 fp8</code>.</p>\n</body></html>\n");
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        fp8t_errorf(c->err, c->errlen, "bisect: cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- output */

void fp8t_bisect_print(FILE *f, const fp8t_bisect_result *res, double threshold) {
    if (!f) return;
    /* the warning first: it qualifies everything that follows */
    char warning[1024];
    if (noise_warning(warning, sizeof warning, res, threshold)) fprintf(f, "\n%s", warning);
    int w = 24; /* the name column fits the longest name */
    for (int i = 0; i < res->n_exp; i++)
        if ((int)strlen(res->exp[i].name) > w) w = (int)strlen(res->exp[i].name);
    fprintf(f, "\n%-*s %10s %10s %9s  %s\n", w, "experiment", "final loss", "tail loss", "gap",
            "verdict");
    for (int i = 0; i < res->n_exp; i++) {
        const fp8t_bisect_exp *e = &res->exp[i];
        char gap[32];
        if (isfinite(e->gap))
            snprintf(gap, sizeof gap, "%+.2f%%", 100 * e->gap);
        else
            snprintf(gap, sizeof gap, "inf");
        fprintf(f, "%-*s %10.4f %10.4f %9s  %s\n", w, e->name, e->final_loss, e->tail_loss, gap,
                e->verdict);
    }
    fprintf(f,
            "(tail loss: mean training loss of the last %d steps; gap: median over those "
            "steps of the relative loss difference vs BF16 on the same batch; threshold "
            "%.2f%%)\n\n%s\n",
            res->tail_steps, 100 * threshold, res->conclusion);
    fflush(f);
}
