/* SVG chart pieces for the HTML report (see report_internal.h). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/report_internal.h"

/* ---- text buffer ---- */

void rb_printf(rpt_buf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->n;
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? room : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->s && (size_t)k < room) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = (b->cap ? b->cap * 2 : 65536) + (size_t)k + 1;
        char *ns = realloc(b->s, nc);
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = nc;
    }
}

void rb_esc(rpt_buf *b, const char *t) {
    for (; t && *t; t++) {
        switch (*t) {
        case '&': rb_printf(b, "&amp;"); break;
        case '<': rb_printf(b, "&lt;"); break;
        case '>': rb_printf(b, "&gt;"); break;
        case '"': rb_printf(b, "&quot;"); break;
        case '\'': rb_printf(b, "&#39;"); break;
        default:
            /* control characters have no place in a report */
            if ((unsigned char)*t >= 0x20 || *t == '\n' || *t == '\t') rb_printf(b, "%c", *t);
        }
    }
}

void rb_free(rpt_buf *b) {
    free(b->s);
    b->s = NULL;
    b->n = b->cap = 0;
}

/* ---- frames and ticks ---- */

double rpt_px(const rpt_frame *f, double x) {
    double span = f->xmax - f->xmin;
    return f->x0 + (span > 0 ? (x - f->xmin) / span : 0.5) * f->w;
}

double rpt_py(const rpt_frame *f, double y) {
    double span = f->ymax - f->ymin;
    return f->y0 + f->h - (span > 0 ? (y - f->ymin) / span : 0.5) * f->h;
}

void rpt_nice_range(double *lo, double *hi, double *step, int target) {
    if (!isfinite(*lo) || !isfinite(*hi)) {
        *lo = 0;
        *hi = 1;
    }
    if (*hi <= *lo) {
        double c = *lo, d = fabs(c) > 0 ? fabs(c) * 0.05 : 0.5;
        *lo = c - d;
        *hi = c + d;
    }
    double raw = (*hi - *lo) / (target > 1 ? target : 1);
    double mag = pow(10.0, floor(log10(raw)));
    double r = raw / mag;
    double nice = r <= 1 ? 1 : r <= 2 ? 2 : r <= 2.5 ? 2.5 : r <= 5 ? 5 : 10;
    *step = nice * mag;
    *lo = floor(*lo / *step + 1e-9) * *step;
    *hi = ceil(*hi / *step - 1e-9) * *step;
}

/* A tick label without float noise: enough decimals for the tick spacing. */
static void tick_label(char *buf, size_t len, double v, double step, int pct) {
    if (pct) {
        v *= 100;
        step *= 100;
    }
    int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    if (step < 1 && fabs(step * pow(10, dec) - round(step * pow(10, dec))) > 1e-6) dec++;
    if (dec > 6) dec = 6;
    if (fabs(v) < step * 1e-6) v = 0;
    if (!pct && fabs(v) >= 1e5 && dec == 0)
        snprintf(buf, len, "%.0fk", v / 1000);
    else
        snprintf(buf, len, "%.*f%s", dec, v, pct ? "%" : "");
}

void rpt_axes(rpt_buf *b, const rpt_frame *f, double xstep, double ystep, const char *xtitle,
              const char *ytitle, int y_pct) {
    char lab[48];
    rb_printf(b, "<g class=\"axes\">\n");
    rb_printf(b,
              "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" class=\"plotbg\"/>\n",
              f->x0, f->y0, f->w, f->h);
    for (double y = f->ymin; y <= f->ymax + ystep * 1e-6; y += ystep) {
        double py = rpt_py(f, y);
        tick_label(lab, sizeof(lab), y, ystep, y_pct);
        rb_printf(b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">%s</text>\n",
                  f->x0, py, f->x0 + f->w, py, f->x0 - 8, py + 4, lab);
    }
    for (double x = f->xmin; x <= f->xmax + xstep * 1e-6; x += xstep) {
        double px = rpt_px(f, x);
        tick_label(lab, sizeof(lab), x, xstep, 0);
        rb_printf(b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>"
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"tickmark\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\" text-anchor=\"middle\">%s</text>\n",
                  px, f->y0, px, f->y0 + f->h, px, f->y0 + f->h, px, f->y0 + f->h + 5, px,
                  f->y0 + f->h + 19, lab);
    }
    rb_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" class=\"frame\"/>\n",
              f->x0, f->y0, f->w, f->h);
    if (xtitle) {
        rb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" class=\"axtitle\" text-anchor=\"middle\">",
                  f->x0 + f->w / 2, f->y0 + f->h + 40);
        rb_esc(b, xtitle);
        rb_printf(b, "</text>\n");
    }
    if (ytitle) {
        double cx = f->x0 - 52, cy = f->y0 + f->h / 2;
        rb_printf(b,
                  "<text x=\"%.1f\" y=\"%.1f\" class=\"axtitle\" text-anchor=\"middle\" "
                  "transform=\"rotate(-90 %.1f %.1f)\">",
                  cx, cy, cx, cy);
        rb_esc(b, ytitle);
        rb_printf(b, "</text>\n");
    }
    rb_printf(b, "</g>\n");
}

/* ---- series ---- */

static void flush_points(rpt_buf *b, const double *pts, int np, const char *color, double width,
                         const char *extra) {
    if (np == 0) return;
    if (np == 1) { /* an isolated sample: a dot */
        rb_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"%s\"/>\n", pts[0], pts[1],
                  width, color);
        return;
    }
    rb_printf(b,
              "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" "
              "stroke-linejoin=\"round\" stroke-linecap=\"round\" %s points=\"",
              color, width, extra ? extra : "");
    for (int i = 0; i < np; i++)
        rb_printf(b, "%s%.1f,%.1f", i ? " " : "", pts[2 * i], pts[2 * i + 1]);
    rb_printf(b, "\"/>\n");
}

void rpt_series(rpt_buf *b, const rpt_frame *f, const int *x, const double *y, int n,
                const char *color, double width, const char *extra) {
    double *pts = malloc(sizeof(double) * 2 * (size_t)(2 * n + 2)); /* [points, 2] */
    if (!pts) return;
    int np = 0;
    int reduce = n > 1500;
    int i = 0;
    while (i < n) {
        if (!isfinite(y[i])) { /* a gap in the line */
            flush_points(b, pts, np, color, width, extra);
            np = 0;
            i++;
            continue;
        }
        double px = rpt_px(f, x[i]);
        if (!reduce) {
            pts[2 * np] = px;
            pts[2 * np + 1] = rpt_py(f, y[i]);
            np++;
            i++;
            continue;
        }
        /* All finite samples of this pixel column: emit min and max in sample order. */
        int col = (int)floor(px);
        int j = i, imin = i, imax = i;
        while (j < n && isfinite(y[j]) && (int)floor(rpt_px(f, x[j])) == col) {
            if (y[j] < y[imin]) imin = j;
            if (y[j] > y[imax]) imax = j;
            j++;
        }
        int first = imin < imax ? imin : imax, second = imin < imax ? imax : imin;
        pts[2 * np] = rpt_px(f, x[first]);
        pts[2 * np + 1] = rpt_py(f, y[first]);
        np++;
        if (second != first) {
            pts[2 * np] = rpt_px(f, x[second]);
            pts[2 * np + 1] = rpt_py(f, y[second]);
            np++;
        }
        i = j;
    }
    flush_points(b, pts, np, color, width, extra);
    free(pts);
}

/* ---- color maps ---- */

static void lerp_stops(char out[8], double t, const unsigned char (*stops)[3], int n) {
    if (!isfinite(t)) t = 0;
    if (t < 0) t = 0;
    if (t > 1) t = 1;
    double s = t * (n - 1);
    int i = (int)floor(s);
    if (i >= n - 1) i = n - 2;
    double u = s - i;
    int rgb[3];
    for (int c = 0; c < 3; c++) rgb[c] = (int)lround(stops[i][c] * (1 - u) + stops[i + 1][c] * u);
    snprintf(out, 8, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
}

void rpt_color_viridis(char out[8], double t) {
    static const unsigned char v[9][3] = {{68, 1, 84},    {71, 44, 122},  {59, 81, 139},
                                          {44, 113, 142}, {33, 144, 141}, {39, 173, 129},
                                          {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};
    lerp_stops(out, t, v, 9);
}

void rpt_color_heat(char out[8], double t) {
    static const unsigned char v[8][3] = {{255, 255, 204}, {255, 237, 160}, {254, 217, 118},
                                          {254, 178, 76},  {253, 141, 60},  {240, 59, 32},
                                          {189, 0, 38},    {128, 0, 38}};
    lerp_stops(out, t, v, 8);
}

/* ---- heatmap ---- */

static void value_label(char *buf, size_t len, double v, const char *unit) {
    double a = fabs(v);
    if (a >= 100 || a == 0)
        snprintf(buf, len, "%.0f%s", v, unit);
    else if (a >= 10)
        snprintf(buf, len, "%.1f%s", v, unit);
    else if (a >= 0.01)
        snprintf(buf, len, "%.2f%s", v, unit);
    else
        snprintf(buf, len, "%.1e%s", v, unit);
}

void rpt_heatmap_svg(rpt_buf *b, const rpt_heatmap *h, double width) {
    static int gradient_id = 0;
    int gid = ++gradient_id;
    double left = 70, right = 110, top = 30, bottom = 46;
    double row_h = h->rows <= 8 ? 26 : h->rows <= 24 ? 18 : 12;
    double plot_w = width - left - right, plot_h = row_h * h->rows;
    double cell_w = plot_w / (h->cols > 0 ? h->cols : 1);
    double height = top + plot_h + bottom;
    double lo = h->lo, hi = h->hi;
    if (!(hi > lo)) hi = lo + 1;
    rb_printf(b,
              "<svg class=\"chart\" viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" "
              "xmlns=\"http://www.w3.org/2000/svg\" role=\"img\">\n",
              width, height, width, height);
    rb_printf(b,
              "<defs><pattern id=\"nodata%d\" width=\"6\" height=\"6\" "
              "patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
              "<rect width=\"6\" height=\"6\" fill=\"#f1f3f5\"/>"
              "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#d0d4d9\" stroke-width=\"2\"/>"
              "</pattern>\n<linearGradient id=\"lg%d\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">",
              gid, gid);
    for (int s = 0; s <= 10; s++) {
        char c[8];
        double t = s / 10.0;
        h->cmap(c, h->reverse ? 1 - t : t);
        rb_printf(b, "<stop offset=\"%.1f\" stop-color=\"%s\"/>", t, c);
    }
    rb_printf(b, "</linearGradient></defs>\n");
    rb_printf(b, "<text x=\"%.1f\" y=\"18\" class=\"hmtitle\">", left);
    rb_esc(b, h->title);
    rb_printf(b, "</text>\n");
    for (int r = 0; r < h->rows; r++) {
        double y = top + r * row_h;
        rb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">", left - 8,
                  y + row_h / 2 + 4);
        rb_esc(b, h->row_labels[r]);
        rb_printf(b, "</text>\n");
        for (int c = 0; c < h->cols; c++) {
            double v = h->values[(size_t)r * h->cols + c];
            char color[32];
            if (isfinite(v)) {
                double t = (v - lo) / (hi - lo);
                h->cmap(color, h->reverse ? 1 - t : t);
            } else {
                snprintf(color, sizeof(color), "url(#nodata%d)", gid);
            }
            /* a hair of overlap hides anti-aliasing seams between cells */
            rb_printf(b,
                      "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\">",
                      left + c * cell_w, y, cell_w + 0.4, row_h - 1, color);
            if (h->tips && h->tips[(size_t)r * h->cols + c]) {
                rb_printf(b, "<title>");
                rb_esc(b, h->tips[(size_t)r * h->cols + c]);
                rb_printf(b, "</title>");
            }
            rb_printf(b, "</rect>\n");
        }
    }
    /* step labels: about 8 of them */
    int every = h->cols > 8 ? (h->cols + 7) / 8 : 1;
    for (int c = 0; c < h->cols; c += every)
        rb_printf(b,
                  "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\" text-anchor=\"middle\">%d</text>\n",
                  left + (c + 0.5) * cell_w, top + plot_h + 16, h->col_steps[c]);
    rb_printf(
        b, "<text x=\"%.1f\" y=\"%.1f\" class=\"axtitle\" text-anchor=\"middle\">step</text>\n",
        left + plot_w / 2, top + plot_h + 38);
    /* legend */
    double lx = left + plot_w + 24, lh = plot_h < 60 ? 60 : plot_h;
    if (lh > 220) lh = 220;
    rb_printf(b,
              "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"%.1f\" fill=\"url(#lg%d)\" "
              "stroke=\"#9aa3ad\" stroke-width=\"0.5\"/>\n",
              lx, top, lh, gid);
    for (int k = 0; k <= 4; k++) {
        double v = lo + (hi - lo) * k / 4.0, y = top + lh - lh * k / 4.0;
        char lab[32];
        value_label(lab, sizeof(lab), v, h->unit);
        rb_printf(b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#6b7280\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\">%s</text>\n",
                  lx + 14, y, lx + 18, y, lx + 21, y + 4, lab);
    }
    rb_printf(b, "</svg>\n");
}
