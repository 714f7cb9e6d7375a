/* HTML report internals: a growable text buffer with HTML escaping, and SVG chart pieces
 * (frames with nice ticks, polylines, markers, heatmaps with a color legend). Everything is
 * inline SVG so the report is one file that opens anywhere, offline. */
#ifndef FP8TRAIN_REPORT_INTERNAL_H
#define FP8TRAIN_REPORT_INTERNAL_H

#include <stddef.h>

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} rpt_buf;

void rb_printf(rpt_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void rb_esc(rpt_buf *b, const char *text); /* text with & < > " ' escaped */
void rb_free(rpt_buf *b);

/* A plot area at (x0, y0) of w x h pixels showing [xmin, xmax] x [ymin, ymax]. */
typedef struct {
    double x0, y0, w, h;
    double xmin, xmax, ymin, ymax;
} rpt_frame;

double rpt_px(const rpt_frame *f, double x);
double rpt_py(const rpt_frame *f, double y);
/* Round [lo, hi] outward to nice tick values; *step gets the tick spacing. */
void rpt_nice_range(double *lo, double *hi, double *step, int target_ticks);
/* Grid lines, ticks with labels, axis titles. y_pct: y tick labels as percentages of 1. */
void rpt_axes(rpt_buf *b, const rpt_frame *f, double xstep, double ystep, const char *xtitle,
              const char *ytitle, int y_pct);
/* A series as a polyline (non-finite samples break it); more than ~1500 samples are reduced
 * to the min and max of each pixel column so spikes survive. */
void rpt_series(rpt_buf *b, const rpt_frame *f, const int *x, const double *y, int n,
                const char *color, double width, const char *extra_attrs);

/* Color maps: t in [0, 1] -> "#rrggbb". */
void rpt_color_viridis(char out[8], double t);
void rpt_color_heat(char out[8], double t); /* light yellow -> dark red */

/* A heatmap: rows x cols cells (values[r * cols + c], NaN = no data, drawn hatched gray),
 * row labels left, column (step) labels below, a color legend right. tips (may be NULL) are
 * per-cell tooltip texts. lo/hi: color domain; reverse: low values get the "hot" end. */
typedef struct {
    const char *title;
    const char *unit; /* legend unit, e.g. "%" or "dB" */
    int rows, cols;
    const double *values;
    const char *const *row_labels;
    const int *col_steps;
    const char *const *tips;
    double lo, hi;
    void (*cmap)(char out[8], double t);
    int reverse;
} rpt_heatmap;
void rpt_heatmap_svg(rpt_buf *b, const rpt_heatmap *h, double width);

#endif
