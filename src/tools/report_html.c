/* The HTML report of a comparison: verdict and summary first, then the loss curves of both
 * runs with events, the relative gap with its threshold band, tables of spikes and events,
 * per-layer x step heatmaps of underflow % and SQNR from stats.jsonl, and the tensors that
 * differ most. One self-contained file: inline CSS and SVG, no scripts, no network. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/compare.h"
#include "fp8train/error.h"
#include "fp8train/io.h"
#include "tools/compare_internal.h"
#include "tools/report_internal.h"

#define COLOR_A "#2563eb"
#define COLOR_B "#ea580c"
#define CHART_W 1100.0
#define HEAT_MAX_COLS 240 /* wider step ranges are binned (worst value per bin) */

static const char *CSS =
    ":root{--ink:#1f2937;--muted:#6b7280;--line:#e5e7eb;--bg:#f6f7f9;--card:#fff}"
    "*{box-sizing:border-box}"
    "body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.45 system-ui,-apple-system,"
    "'Segoe UI',Roboto,'DejaVu Sans',Helvetica,Arial,sans-serif}"
    "main{max-width:1180px;margin:0 auto;padding:24px 28px 40px}"
    "header h1{font-size:22px;margin:0 0 4px;letter-spacing:-.01em}"
    "header .runs{color:var(--muted);font-size:13px;line-height:1.9}"
    ".sw{display:inline-block;width:11px;height:11px;border-radius:2px;margin:0 5px 0 0;"
    "vertical-align:-1px}"
    "section{background:var(--card);border:1px solid var(--line);border-radius:10px;"
    "padding:16px 20px;margin:16px 0;box-shadow:0 1px 2px rgba(0,0,0,.03)}"
    "h2{font-size:15px;margin:0 0 10px;font-weight:650}"
    "h3{font-size:13px;margin:14px 0 4px;font-weight:600;color:#374151}"
    ".verdict{display:flex;gap:18px;align-items:flex-start;border-left:6px solid var(--vc)}"
    ".badge{flex:none;background:var(--vc);color:#fff;font-weight:700;font-size:13px;"
    "letter-spacing:.06em;text-transform:uppercase;padding:6px 12px;border-radius:6px;margin-top:2px}"
    ".verdict p{margin:2px 0 6px}.verdict .why{font-size:15px;font-weight:550}"
    ".verdict .next{color:#374151}.verdict .note{color:var(--muted);font-size:13px}"
    ".cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(150px,1fr));gap:10px;"
    "background:none;border:none;box-shadow:none;padding:0}"
    ".card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:10px 14px}"
    ".card .k{color:var(--muted);font-size:12px}.card .v{font-size:20px;font-weight:650;"
    "font-variant-numeric:tabular-nums}.card .s{color:var(--muted);font-size:12px}"
    ".bad{color:#b91c1c}.ok{color:#15803d}"
    "table{border-collapse:collapse;width:100%;font-size:13px;font-variant-numeric:tabular-nums}"
    "th{text-align:left;color:var(--muted);font-weight:600;border-bottom:1px solid var(--line);"
    "padding:5px 8px}td{border-bottom:1px solid #f0f1f3;padding:5px 8px}"
    "td.n,th.n{text-align:right}tr.flag td{background:#fef2f2}"
    ".legend{display:flex;flex-wrap:wrap;gap:14px;font-size:12.5px;color:#374151;margin:2px 0 4px}"
    ".legend span{white-space:nowrap}"
    "svg.chart{display:block;width:100%;height:auto}"
    ".plotbg{fill:#fff}.frame{fill:none;stroke:#9ca3af;stroke-width:1}"
    ".grid{stroke:#eef0f3;stroke-width:1}.tickmark{stroke:#9ca3af}"
    ".tick{font-size:11.5px;fill:#4b5563}.axtitle{font-size:12.5px;fill:#374151}"
    ".hmtitle{font-size:13px;font-weight:600;fill:#1f2937}"
    ".evlabel{font-size:10.5px}.muted{color:var(--muted)}"
    "footer{color:var(--muted);font-size:12px;text-align:center;margin-top:18px}"
    "code{font-family:ui-monospace,'DejaVu Sans Mono',monospace;font-size:12.5px;"
    "background:#f3f4f6;padding:1px 4px;border-radius:4px}";

static const char *class_color(fp8t_compare_class c) {
    switch (c) {
    case FP8T_CMP_MATCH: return "#16a34a";
    case FP8T_CMP_SPIKE: return "#d97706";
    case FP8T_CMP_DRIFT: return "#7c3aed";
    case FP8T_CMP_EARLY: return "#dc2626";
    default: return "#991b1b";
    }
}

static const char *event_color(const char *kind) {
    if (strcmp(kind, "nan") == 0 || strcmp(kind, "inf") == 0) return "#dc2626";
    if (strcmp(kind, "spike") == 0) return "#d97706";
    if (strcmp(kind, "drift") == 0) return "#7c3aed";
    if (strcmp(kind, "shadow") == 0) return "#0d9488";
    if (strcmp(kind, "fallback") == 0) return "#4b5563";
    return "#64748b";
}

static void pct(char *buf, size_t len, double x, int sign) {
    if (!isfinite(x))
        snprintf(buf, len, "n/a");
    else
        snprintf(buf, len, sign ? "%+.2f%%" : "%.2f%%", 100.0 * x);
}

static void card(rpt_buf *b, const char *k, const char *v, const char *sub, int bad) {
    rb_printf(b, "<div class=\"card\"><div class=\"k\">");
    rb_esc(b, k);
    rb_printf(b, "</div><div class=\"v%s\">", bad ? " bad" : "");
    rb_esc(b, v);
    rb_printf(b, "</div><div class=\"s\">");
    rb_esc(b, sub);
    rb_printf(b, "</div></div>\n");
}

/* ---- charts ---- */

/* Event markers of both runs on a frame: a dashed line and a small flag per event. */
static void draw_events(rpt_buf *b, const rpt_frame *f, const fp8t_run *a, const fp8t_run *bb,
                        int labels) {
    const fp8t_run *runs[2] = {a, bb};
    int drawn = 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < runs[k]->n_events; i++) {
            const fp8t_event_row *e = &runs[k]->events[i];
            if (e->step < f->xmin || e->step > f->xmax) continue;
            double x = rpt_px(f, e->step);
            const char *c = event_color(e->kind);
            rb_printf(b, "<g><title>run %c step %d: %s", 'A' + k, e->step, "");
            rb_esc(b, e->kind);
            if (e->message[0]) {
                rb_printf(b, " - ");
                rb_esc(b, e->message);
            }
            rb_printf(
                b,
                "</title><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-width=\"1.2\" stroke-dasharray=\"4 3\" opacity=\"0.8\"/>"
                "<path d=\"M%.1f %.1f l5 -8 h-10 z\" fill=\"%s\"/>",
                x, f->y0, x, f->y0 + f->h, c, x, f->y0, c);
            if (labels && drawn < 14) {
                rb_printf(b,
                          "<text x=\"%.1f\" y=\"%.1f\" class=\"evlabel\" fill=\"%s\" "
                          "text-anchor=\"middle\">",
                          x, f->y0 - 11, c);
                rb_esc(b, e->kind);
                rb_printf(b, "</text>");
            }
            rb_printf(b, "</g>\n");
            drawn++;
        }
}

static void chart_open(rpt_buf *b, double h) {
    rb_printf(b,
              "<svg class=\"chart\" viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" "
              "xmlns=\"http://www.w3.org/2000/svg\" role=\"img\">\n",
              CHART_W, h, CHART_W, h);
}

static void loss_chart(rpt_buf *b, const fp8t_run *a, const fp8t_run *bb,
                       const fp8t_compare_result *r) {
    int n = r->n;
    /* y range: both runs after the first 5% of steps (the initial drop would flatten the
     * rest); earlier samples above the range are clipped. */
    double lo = INFINITY, hi = -INFINITY;
    for (int i = n / 20; i < n; i++) {
        double v[2] = {r->loss_a[i], r->loss_b[i]};
        for (int k = 0; k < 2; k++)
            if (isfinite(v[k])) {
                lo = fmin(lo, v[k]);
                hi = fmax(hi, v[k]);
            }
    }
    int clipped = 0;
    for (int i = 0; i < n / 20; i++)
        clipped |= (isfinite(r->loss_a[i]) && r->loss_a[i] > hi) ||
                   (isfinite(r->loss_b[i]) && r->loss_b[i] > hi);
    double pad = (hi - lo) * 0.04;
    lo -= pad;
    hi += pad;
    double ystep, xstep, xlo = r->steps[0], xhi = r->steps[n - 1];
    rpt_nice_range(&lo, &hi, &ystep, 6);
    rpt_nice_range(&xlo, &xhi, &xstep, 10);
    rpt_frame f = {78, 30, CHART_W - 78 - 24, 300, xlo, xhi, lo, hi};
    rb_printf(b, "<div class=\"legend\"><span><i class=\"sw\" style=\"background:" COLOR_A
                 "\"></i>A: ");
    rb_esc(b, a->label);
    rb_printf(b, "</span><span><i class=\"sw\" style=\"background:" COLOR_B "\"></i>B: ");
    rb_esc(b, bb->label);
    rb_printf(b, "</span>");
    if (r->n_spikes)
        rb_printf(b, "<span><i class=\"sw\" style=\"background:#fff;border:2px solid #d97706;"
                     "border-radius:50%%\"></i>detected spike</span>");
    if (a->n_events || bb->n_events)
        rb_printf(b, "<span><i class=\"sw\" style=\"background:#64748b\"></i>events (dashed; "
                     "hover for details)</span>");
    if (clipped)
        rb_printf(b, "<span class=\"muted\">y axis fitted to steps after the first 5%%</span>");
    rb_printf(b, "</div>\n");
    chart_open(b, 380);
    rpt_axes(b, &f, xstep, ystep, "step", "training loss", 0);
    rb_printf(b,
              "<defs><clipPath id=\"clip-loss\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
              "height=\"%.1f\"/></clipPath></defs>\n",
              f.x0, f.y0, f.w, f.h);
    rb_printf(b, "<g clip-path=\"url(#clip-loss)\">\n");
    rpt_series(b, &f, r->steps, r->loss_a, n, COLOR_A, 1.8, "class=\"series-a\"");
    rpt_series(b, &f, r->steps, r->loss_b, n, COLOR_B, 1.8, "class=\"series-b\" opacity=\"0.9\"");
    for (int i = 0; i < r->n_spikes; i++) {
        const fp8t_spike_report *s = &r->spikes[i];
        int idx = -1;
        for (int j = 0; j < n; j++)
            if (r->steps[j] == s->step) {
                idx = j;
                break;
            }
        if (idx < 0) continue;
        double v = s->run ? r->loss_b[idx] : r->loss_a[idx];
        rb_printf(b,
                  "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"7\" fill=\"none\" stroke=\"#d97706\" "
                  "stroke-width=\"2\"><title>spike in run %c at step %d: %+.1f%%, %s</title>"
                  "</circle>\n",
                  rpt_px(&f, s->step), rpt_py(&f, v), 'A' + s->run, s->step, 100 * s->size_rel,
                  s->recovery_steps < 0 ? "no recovery" : "recovered");
    }
    rb_printf(b, "</g>\n");
    draw_events(b, &f, a, bb, 1);
    rb_printf(b, "</svg>\n");
}

static void gap_chart(rpt_buf *b, const fp8t_run *a, const fp8t_run *bb,
                      const fp8t_compare_result *r) {
    int n = r->n;
    /* Each side of zero reaches at least 2.5 thresholds, the smoothed gap, and the raw gap's
     * 98th percentile on that side (one spike must not squash everything else). */
    double ext[2] = {2.5 * r->threshold, 2.5 * r->threshold}; /* [below 0, above 0] */
    double *tmp = malloc(sizeof(double) * (size_t)n);
    for (int side = 0; side < 2; side++) {
        int k = 0;
        for (int i = 0; i < n; i++) {
            double g = side ? r->gap[i] : -r->gap[i],
                   sm = side ? r->gap_smooth[i] : -r->gap_smooth[i];
            if (isfinite(sm)) ext[side] = fmax(ext[side], 1.15 * sm);
            if (isfinite(g) && g > 0) tmp[k++] = g;
        }
        if (k) {
            for (int i = 1; i < k; i++) /* insertion sort is fine for a report */
                for (int j = i; j > 0 && tmp[j - 1] > tmp[j]; j--) {
                    double t = tmp[j];
                    tmp[j] = tmp[j - 1];
                    tmp[j - 1] = t;
                }
            ext[side] = fmax(ext[side], 1.1 * tmp[(int)(0.98 * (k - 1))]);
        }
    }
    free(tmp);
    double lo = -ext[0], hi = ext[1], ystep, xstep, xlo = r->steps[0], xhi = r->steps[n - 1];
    rpt_nice_range(&lo, &hi, &ystep, 6);
    rpt_nice_range(&xlo, &xhi, &xstep, 10);
    rpt_frame f = {78, 30, CHART_W - 78 - 24, 230, xlo, xhi, lo, hi};
    char thr[32];
    pct(thr, sizeof(thr), r->threshold, 0);
    rb_printf(
        b,
        "<div class=\"legend\"><span><i class=\"sw\" style=\"background:#fdba74\"></i>"
        "gap per step (B&#8722;A)/|A|</span><span><i class=\"sw\" style=\"background:#9a3412\">"
        "</i>trailing median over %d steps</span><span><i class=\"sw\" style=\"background:#dcfce7;"
        "border:1px dashed #16a34a\"></i>within &#177;%s</span></div>\n",
        r->window, thr);
    chart_open(b, 310);
    rpt_axes(b, &f, xstep, ystep, "step", "relative gap", 1);
    double yt = rpt_py(&f, r->threshold), yb = rpt_py(&f, -r->threshold);
    rb_printf(b,
              "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#dcfce7\" "
              "opacity=\"0.6\"/>\n",
              f.x0, yt, f.w, yb - yt);
    rb_printf(b,
              "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#16a34a\" "
              "stroke-dasharray=\"5 4\"/><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
              "stroke=\"#16a34a\" stroke-dasharray=\"5 4\"/>\n",
              f.x0, yt, f.x0 + f.w, yt, f.x0, yb, f.x0 + f.w, yb);
    double y0 = rpt_py(&f, 0);
    rb_printf(b,
              "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#6b7280\" "
              "stroke-width=\"1\"/>\n",
              f.x0, y0, f.x0 + f.w, y0);
    rb_printf(b,
              "<defs><clipPath id=\"clip-gap\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
              "height=\"%.1f\"/></clipPath></defs><g clip-path=\"url(#clip-gap)\">\n",
              f.x0, f.y0, f.w, f.h);
    rpt_series(b, &f, r->steps, r->gap, n, "#fdba74", 1.2, "class=\"series-gap\"");
    rpt_series(b, &f, r->steps, r->gap_smooth, n, "#9a3412", 2.2, "class=\"series-smooth\"");
    rb_printf(b, "</g>\n");
    if (r->drift_step >= 0 && r->cls == FP8T_CMP_DRIFT) {
        double x = rpt_px(&f, r->drift_step);
        rb_printf(b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#7c3aed\" "
                  "stroke-width=\"1.5\"/><text x=\"%.1f\" y=\"%.1f\" class=\"evlabel\" "
                  "fill=\"#7c3aed\">drift from step %d</text>\n",
                  x, f.y0, x, f.y0 + f.h, x + 4, f.y0 + 12, r->drift_step);
    }
    draw_events(b, &f, a, bb, 0);
    rb_printf(b, "</svg>\n");
}

/* ---- heatmaps from stats.jsonl ---- */

static int cmp_int(const void *pa, const void *pb) {
    int a = *(const int *)pa, b = *(const int *)pb;
    return (a > b) - (a < b);
}

/* Sorted distinct values of v[0..n-1] in place; returns the count. */
static int distinct(int *v, int n) {
    qsort(v, (size_t)n, sizeof(int), cmp_int);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (m == 0 || v[m - 1] != v[i]) v[m++] = v[i];
    return m;
}

static int index_of(const int *v, int n, int x) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (v[mid] == x) return mid;
        if (v[mid] < x)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

/* Color domains shared by both runs' heatmaps, so equal colors mean equal values. Underflow
 * spans at least 0..1% (a few hundredths of a percent is no alarm and stays pale). */
typedef struct {
    double under_hi, sqnr_lo, sqnr_hi;
} heat_domain;

static heat_domain heat_domain_of(const fp8t_run *a, const fp8t_run *bb) {
    heat_domain d = {1.0, INFINITY, -INFINITY};
    const fp8t_run *runs[2] = {a, bb};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < runs[k]->n_stats; i++) {
            const fp8t_stat_row *s = &runs[k]->stats[i];
            if (!s->is_operand || s->micro != 0) continue;
            if (isfinite(s->underflow_pct)) d.under_hi = fmax(d.under_hi, s->underflow_pct);
            double q = s->sqnr_db > SQNR_CAP_DB ? SQNR_CAP_DB : s->sqnr_db;
            if (isfinite(q)) {
                d.sqnr_lo = fmin(d.sqnr_lo, q);
                d.sqnr_hi = fmax(d.sqnr_hi, q);
            }
        }
    if (!isfinite(d.sqnr_lo)) {
        d.sqnr_lo = 0;
        d.sqnr_hi = 1;
    }
    return d;
}

static void run_heatmaps(rpt_buf *b, const fp8t_run *run, char which, const heat_domain *dom) {
    int n = run->n_stats;
    int *layers = malloc(sizeof(int) * (size_t)(n + 1)),
        *steps = malloc(sizeof(int) * (size_t)(n + 1));
    int nl = 0, ns = 0;
    for (int i = 0; i < n; i++) {
        if (!run->stats[i].is_operand) continue;
        /* the head sorts last */
        layers[nl++] = run->stats[i].layer < 0 ? 1 << 30 : run->stats[i].layer;
        steps[ns++] = run->stats[i].step;
    }
    nl = distinct(layers, nl);
    ns = distinct(steps, ns);
    if (nl == 0 || ns == 0) {
        free(layers);
        free(steps);
        return;
    }
    int cols = ns > HEAT_MAX_COLS ? HEAT_MAX_COLS : ns;
    size_t cells = (size_t)nl * (size_t)cols;
    double *under = malloc(sizeof(double) * cells), *sqnr = malloc(sizeof(double) * cells);
    int *under_src = malloc(sizeof(int) * cells), *sqnr_src = malloc(sizeof(int) * cells);
    int *col_steps = malloc(sizeof(int) * (size_t)cols);
    for (size_t c = 0; c < cells; c++) {
        under[c] = sqnr[c] = NAN;
        under_src[c] = sqnr_src[c] = -1;
    }
    for (int c = 0; c < cols; c++) col_steps[c] = steps[(int)((long)c * ns / cols)];
    /* worst tensor of the layer: max underflow, min SQNR */
    for (int i = 0; i < n; i++) {
        const fp8t_stat_row *s = &run->stats[i];
        if (!s->is_operand || s->micro != 0) continue;
        int l = index_of(layers, nl, s->layer < 0 ? 1 << 30 : s->layer);
        int c = (int)((long)index_of(steps, ns, s->step) * cols / ns);
        size_t k = (size_t)l * cols + (size_t)c;
        if (isfinite(s->underflow_pct) && (!isfinite(under[k]) || s->underflow_pct > under[k])) {
            under[k] = s->underflow_pct;
            under_src[k] = i;
        }
        double q = s->sqnr_db > SQNR_CAP_DB ? SQNR_CAP_DB : s->sqnr_db;
        if (isfinite(q) && (!isfinite(sqnr[k]) || q < sqnr[k])) {
            sqnr[k] = q;
            sqnr_src[k] = i;
        }
    }
    char **row_labels = malloc(sizeof(char *) * (size_t)nl);
    for (int l = 0; l < nl; l++) {
        row_labels[l] = malloc(16);
        if (layers[l] == 1 << 30)
            snprintf(row_labels[l], 16, "head");
        else
            snprintf(row_labels[l], 16, "layer %d", layers[l]);
    }
    char **tips_u = calloc(cells, sizeof(char *)), **tips_s = calloc(cells, sizeof(char *));
    for (size_t c = 0; c < cells; c++) {
        int src[2] = {under_src[c], sqnr_src[c]};
        char **dst[2] = {tips_u, tips_s};
        for (int k = 0; k < 2; k++) {
            if (src[k] < 0) continue;
            const fp8t_stat_row *s = &run->stats[src[k]];
            dst[k][c] = malloc(160);
            snprintf(dst[k][c], 160, "%s, step %d: worst %s %.4g%s (%s %s %s, %s)",
                     row_labels[c / (size_t)cols], s->step, k ? "SQNR" : "underflow",
                     k ? s->sqnr_db : s->underflow_pct, k ? " dB" : "%", s->module, s->gemm,
                     s->tensor, s->precision);
        }
    }
    char title[160];
    rb_printf(b, "<h3>run %c: ", which);
    rb_esc(b, run->label);
    rb_printf(b, "</h3>\n");
    snprintf(title, sizeof(title),
             "underflow %% (nonzero values that become 0), worst tensor of the layer");
    rpt_heatmap h = {title,
                     "%",
                     nl,
                     cols,
                     under,
                     (const char *const *)row_labels,
                     col_steps,
                     (const char *const *)tips_u,
                     0,
                     dom->under_hi,
                     rpt_color_heat,
                     0};
    rpt_heatmap_svg(b, &h, CHART_W);
    snprintf(title, sizeof(title),
             "SQNR dB of the FP8 image, worst tensor of the layer (low = bad)");
    rpt_heatmap hs = {title,
                      " dB",
                      nl,
                      cols,
                      sqnr,
                      (const char *const *)row_labels,
                      col_steps,
                      (const char *const *)tips_s,
                      dom->sqnr_lo,
                      dom->sqnr_hi,
                      rpt_color_viridis,
                      0};
    rpt_heatmap_svg(b, &hs, CHART_W);
    for (size_t c = 0; c < cells; c++) {
        free(tips_u[c]);
        free(tips_s[c]);
    }
    for (int l = 0; l < nl; l++) free(row_labels[l]);
    free(tips_u);
    free(tips_s);
    free(row_labels);
    free(under);
    free(sqnr);
    free(under_src);
    free(sqnr_src);
    free(col_steps);
    free(layers);
    free(steps);
}

/* ---- tables ---- */

static void site_cell(rpt_buf *b, const fp8t_site_diff *d) {
    if (d->layer < 0)
        rb_printf(b, "<td>head</td>");
    else
        rb_printf(b, "<td>layer %d</td>", d->layer);
    rb_printf(b, "<td>");
    rb_esc(b, d->module);
    rb_printf(b, "</td><td>");
    rb_esc(b, d->gemm);
    rb_printf(b, "</td><td>");
    rb_esc(b, d->tensor);
    rb_printf(b, "</td>");
}

static void num_cell(rpt_buf *b, const char *fmt, double v) {
    if (!isfinite(v)) {
        rb_printf(b, "<td class=\"n\">&#8212;</td>");
        return;
    }
    rb_printf(b, "<td class=\"n\">");
    rb_printf(b, fmt, v);
    rb_printf(b, "</td>");
}

static void tables(rpt_buf *b, const fp8t_run *a, const fp8t_run *bb,
                   const fp8t_compare_result *r) {
    if (r->n_spikes) {
        rb_printf(b, "<section><h2>Spikes</h2><table><tr><th>run</th><th class=\"n\">step</th>"
                     "<th class=\"n\">size</th><th class=\"n\">robust z</th>"
                     "<th class=\"n\">recovery (steps)</th><th>reading</th></tr>\n");
        for (int i = 0; i < r->n_spikes; i++) {
            const fp8t_spike_report *s = &r->spikes[i];
            rb_printf(b,
                      "<tr%s><td>%c</td><td class=\"n\">%d</td><td class=\"n\">%+.1f%%</td>"
                      "<td class=\"n\">%.1f</td>",
                      s->slow && !s->in_other_run ? " class=\"flag\"" : "", 'A' + s->run, s->step,
                      100 * s->size_rel, s->zscore);
            if (s->recovery_steps < 0)
                rb_printf(b, "<td class=\"n\">never</td>");
            else
                rb_printf(b, "<td class=\"n\">%d</td>", s->recovery_steps);
            rb_printf(b, "<td>%s</td></tr>\n",
                      s->in_other_run ? "in both runs: the data, not FP8"
                      : s->slow       ? "slow recovery: points at FP8 (treat as drift)"
                                      : "fast recovery: usually not FP8's fault");
        }
        rb_printf(b, "</table></section>\n");
    }
    if (a->n_events || bb->n_events) {
        rb_printf(b, "<section><h2>Events</h2><table><tr><th>run</th><th class=\"n\">step</th>"
                     "<th>kind</th><th>message</th></tr>\n");
        const fp8t_run *runs[2] = {a, bb};
        int shown = 0;
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < runs[k]->n_events && shown < 200; i++, shown++) {
                const fp8t_event_row *e = &runs[k]->events[i];
                rb_printf(b,
                          "<tr><td>%c</td><td class=\"n\">%d</td><td><i class=\"sw\" "
                          "style=\"background:%s\"></i>",
                          'A' + k, e->step, event_color(e->kind));
                rb_esc(b, e->kind);
                rb_printf(b, "</td><td>");
                rb_esc(b, e->message);
                rb_printf(b, "</td></tr>\n");
            }
        rb_printf(b, "</table></section>\n");
    }
    if (r->have_stats) {
        rb_printf(b, "<section><h2>Per-layer FP8 statistics</h2>"
                     "<p class=\"muted\">From stats.jsonl (--inspect): each cell is the worst "
                     "quantized operand (input, weight, grad_output) of the layer at that step; "
                     "hover a cell for the tensor.</p>\n");
        heat_domain dom = heat_domain_of(a, bb);
        if (a->n_stats) run_heatmaps(b, a, 'A', &dom);
        if (bb->n_stats) run_heatmaps(b, bb, 'B', &dom);
        if (r->have_stats == 2)
            rb_printf(b, "<h3>Tensors whose FP8 error differs most between the runs</h3>"
                         "<p class=\"muted\">Mean over the steps inspected in both runs, ranked "
                         "by SQNR(A) &#8722; SQNR(B).</p>\n");
        else
            rb_printf(b,
                      "<h3>Tensors with the largest FP8 error (only run %c was inspected)</h3>\n",
                      a->n_stats ? 'A' : 'B');
        rb_printf(
            b,
            "<table><tr><th>layer</th><th>module</th><th>GEMM</th><th>tensor</th>"
            "<th class=\"n\">SQNR A</th><th class=\"n\">SQNR B</th><th class=\"n\">&#916; SQNR</th>"
            "<th class=\"n\">"
            "cosine A</th><th class=\"n\">cosine B</th><th class=\"n\">underflow A</th>"
            "<th class=\"n\">underflow B</th><th>best what-if recipe (SQNR, "
            "underflow)</th><th>worst block / rowwise tile (SQNR, underflow)</th>"
            "</tr>\n");
        for (int i = 0; i < r->n_sites; i++) {
            const fp8t_site_diff *d = &r->sites[i];
            rb_printf(b, "<tr>");
            site_cell(b, d);
            num_cell(b, "%.1f dB", d->sqnr_a);
            num_cell(b, "%.1f dB", d->sqnr_b);
            if (r->have_stats == 2 && d->score > 3)
                rb_printf(b, "<td class=\"n bad\"><b>%+.1f dB</b></td>", -d->score);
            else
                num_cell(b, "%+.1f dB", r->have_stats == 2 ? -d->score : NAN);
            num_cell(b, "%.6f", d->cos_a);
            num_cell(b, "%.6f", d->cos_b);
            num_cell(b, "%.3f%%", d->under_a);
            num_cell(b, "%.3f%%", d->under_b);
            /* the recipe that would quantize this tensor best, next to the one in use */
            if (d->whatif_run && d->whatif_best >= 0) {
                rb_printf(b, "<td>%s: %.1f dB, %.3f%% (run %c, in use: ",
                          fp8t_whatif_names[d->whatif_best], d->whatif_sqnr[d->whatif_best],
                          d->whatif_under[d->whatif_best], d->whatif_run);
                rb_esc(b, d->precision);
                rb_printf(b, ")</td>");
            } else
                rb_printf(b, "<td>&#8211;</td>");
            /* the GEMM's own tiles, each on its own: a block-scaled tensor hides its error in
             * its worst tiles */
            if (!isnan(d->tile_sqnr_a) || !isnan(d->tile_sqnr_b)) {
                rb_printf(b, "<td>");
                if (!isnan(d->tile_sqnr_a))
                    rb_printf(b, "A %.1f dB, %.3f%%", d->tile_sqnr_a, d->tile_under_a);
                if (!isnan(d->tile_sqnr_b))
                    rb_printf(b, "%sB %.1f dB, %.3f%%", isnan(d->tile_sqnr_a) ? "" : "; ",
                              d->tile_sqnr_b, d->tile_under_b);
                rb_printf(b, "</td>");
            } else {
                rb_printf(b, "<td>&#8211;</td>");
            }
            rb_printf(b, "</tr>\n");
        }
        rb_printf(b, "</table></section>\n");
    }
    if (r->n_dumps || r->dump_note[0]) {
        rb_printf(b,
                  "<section><h2>Dumped tensors, B against A</h2><p class=\"muted\">%d "
                  "tensors compared, <b class=\"%s\">%d with cosine &lt; 0.99</b> (the seeds' "
                  "rule: that layer's quantization error is too large).",
                  r->n_dumps, r->n_dumps_flagged ? "bad" : "ok", r->n_dumps_flagged);
        if (r->dump_note[0]) {
            rb_printf(b, " ");
            rb_esc(b, r->dump_note);
        }
        rb_printf(b,
                  "</p>\n<table><tr><th class=\"n\">step</th><th>tensor</th><th class=\"n\">"
                  "cosine</th><th class=\"n\">relative L2</th><th class=\"n\">SQNR</th></tr>\n");
        for (int i = 0; i < r->n_dumps && i < 30; i++) {
            const fp8t_dump_diff *d = &r->dumps[i];
            rb_printf(b, "<tr%s><td class=\"n\">%d</td><td><code>",
                      d->flagged ? " class=\"flag\"" : "", d->step);
            rb_esc(b, d->name);
            rb_printf(b, "</code></td>");
            num_cell(b, "%.6f", d->cosine);
            num_cell(b, "%.3e", d->rel_l2);
            num_cell(b, "%.1f dB", d->sqnr_db > 1e299 ? INFINITY : d->sqnr_db);
            rb_printf(b, "</tr>\n");
        }
        rb_printf(b, "</table></section>\n");
    }
}

int fp8t_report_html_write(const char *path, const fp8t_run *a, const fp8t_run *bb,
                           const fp8t_compare_result *r, char *err, size_t errlen) {
    rpt_buf b = {0};
    rb_printf(&b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
                  "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\n"
                  "<title>fp8train compare: ");
    rb_esc(&b, a->label);
    rb_printf(&b, " vs ");
    rb_esc(&b, bb->label);
    rb_printf(&b, "</title>\n<style>%s</style>\n</head>\n<body>\n<main>\n", CSS);
    rb_printf(&b, "<header><h1>fp8train compare</h1><div class=\"runs\"><div><i class=\"sw\" "
                  "style=\"background:" COLOR_A "\"></i><b>A</b> baseline <b>");
    rb_esc(&b, a->label);
    rb_printf(&b, "</b> <code>");
    rb_esc(&b, a->metrics_path);
    rb_printf(&b,
              "</code></div><div><i class=\"sw\" style=\"background:" COLOR_B "\"></i><b>B</b> "
              "under test <b>");
    rb_esc(&b, bb->label);
    rb_printf(&b, "</b> <code>");
    rb_esc(&b, bb->metrics_path);
    rb_printf(&b, "</code></div></div></header>\n");

    /* verdict */
    rb_printf(&b,
              "<section class=\"verdict\" style=\"--vc:%s\"><div class=\"badge\">%s</div><div>"
              "<p class=\"why\">",
              class_color(r->cls), fp8t_compare_class_name(r->cls));
    rb_esc(&b, r->verdict);
    rb_printf(&b, "</p><p class=\"next\"><b>Next:</b> ");
    rb_esc(&b, r->advice);
    rb_printf(&b, "</p>");
    for (int i = 0; i < r->n_notes; i++) {
        rb_printf(&b, "<p class=\"note\">");
        rb_esc(&b, r->notes[i]);
        rb_printf(&b, "</p>");
    }
    rb_printf(&b, "</div></section>\n");

    /* summary cards */
    char v[64], s[96];
    rb_printf(&b, "<section class=\"cards\">\n");
    snprintf(v, sizeof(v), "%d", r->n);
    snprintf(s, sizeof(s), "steps %d to %d", r->steps[0], r->steps[r->n - 1]);
    card(&b, "aligned steps", v, s, 0);
    pct(v, sizeof(v), r->mean_abs_gap, 0);
    snprintf(s, sizeof(s), "threshold %.3g%%", 100 * r->threshold);
    card(&b, "mean |gap|", v, s, r->mean_abs_gap > r->threshold);
    pct(v, sizeof(v), r->max_abs_gap, 0);
    snprintf(s, sizeof(s), "at step %d", r->max_gap_step);
    card(&b, "max |gap|", v, s, 0);
    pct(v, sizeof(v), r->early_gap, 0);
    card(&b, "early gap", v, "median, first 10% of steps", r->early_gap > r->threshold);
    pct(v, sizeof(v), r->late_gap, 1);
    snprintf(s, sizeof(s), "trailing median of %d steps", r->window);
    card(&b, "gap at the end", v, s, fabs(r->late_gap) > r->threshold);
    snprintf(v, sizeof(v), "%+.2e", r->trend);
    card(&b, "trend of |gap|", v, "per step, second half", 0);
    if (isfinite(r->val_gap)) {
        pct(v, sizeof(v), r->val_gap, 1);
        snprintf(s, sizeof(s), "validation loss, step %d", r->val_step);
        card(&b, "val gap", v, s, fabs(r->val_gap) > r->threshold);
    }
    rb_printf(&b, "</section>\n");

    rb_printf(&b, "<section><h2>Training loss</h2>\n");
    loss_chart(&b, a, bb, r);
    rb_printf(&b, "</section>\n<section><h2>Relative gap of B against A</h2>\n");
    gap_chart(&b, a, bb, r);
    rb_printf(&b, "</section>\n");
    tables(&b, a, bb, r);
    rb_printf(&b,
              "<footer>Generated by <code>fp8train compare</code>. Gap = (loss<sub>B</sub> "
              "&#8722; loss<sub>A</sub>) / |loss<sub>A</sub>|; classes follow the FP8 "
              "debugging procedure (docs/debugging.md).</footer>\n</main>\n</body>\n</html>\n");
    if (b.oom) {
        rb_free(&b);
        return fp8t_errorf(err, errlen, "%s: out of memory building the report", path);
    }
    int rc = fp8t_write_file_atomic(path, b.s, b.n, err, errlen);
    rb_free(&b);
    return rc;
}
