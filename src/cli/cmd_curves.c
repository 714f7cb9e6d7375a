/* `fp8train curves RUN_A [RUN_B ...]`: the runs' training loss side by side — a table of
 * sampled steps, an ASCII plot, and the final gap of each run against the first. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_args.h"
#include "fp8train/compare.h"
#include "fp8train/error.h"

#define MAX_RUNS 6
static const char MARKS[MAX_RUNS] = {'o', '*', '+', 'x', '#', '@'};

typedef struct {
    int rows, width, height;
} curves_opts;

#define F(f) FP8T_OPT_FIELD(curves_opts, f)
static const fp8t_opt OPTS[] = {
    {.name = "rows",
     .arg = "N",
     .type = FP8T_OPT_INT,
     F(rows),
     .lo = 2,
     .hi = 1000,
     .help = "sampled steps in the table"},
    {.name = "width",
     .arg = "N",
     .type = FP8T_OPT_INT,
     F(width),
     .lo = 16,
     .hi = 400,
     .help = "columns of the ASCII plot"},
    {.name = "height",
     .arg = "N",
     .type = FP8T_OPT_INT,
     F(height),
     .lo = 4,
     .hi = 200,
     .help = "rows of the ASCII plot"},
};
#undef F

#define STR_(x) #x
#define STR(x) STR_(x)
static const fp8t_opt_spec SPEC = {
    .cmd = "curves",
    .usage = "RUN_A [RUN_B ...] [--rows N] [--width N] [--height N]",
    .about = "Prints the training loss of up to " STR(
        MAX_RUNS) " runs (directories or "
                  "metrics.jsonl files)\nside by side: sampled steps, an ASCII plot, and each run's "
                  "final loss\n(mean over the last 10% of its steps) and its gap to RUN_A.\n",
    .epilog = "Exit status: 0, or 2 on bad input.\n",
    .opts = OPTS,
    .n_opts = (int)(sizeof(OPTS) / sizeof(OPTS[0])),
    .max_pos = MAX_RUNS,
    .wrap = CLI_HELP_WRAP,
};

/* Loss of run r at `step` (NaN when it has no finite loss there). */
static double loss_at(const fp8t_run *r, int step) {
    const fp8t_metric_row *m = fp8t_run_metric_at(r, step);
    return m && m->has_loss ? m->loss : NAN;
}

/* Mean finite training loss over the last 10% of the run's loss rows (at least one). */
static double tail_mean(const fp8t_run *r, int *from_step) {
    int n_loss = 0;
    for (int i = 0; i < r->n_metrics; i++) n_loss += r->metrics[i].has_loss;
    int tail = n_loss / 10 > 0 ? n_loss / 10 : 1, seen = 0, cnt = 0;
    double sum = 0;
    *from_step = -1;
    for (int i = r->n_metrics - 1; i >= 0 && seen < tail; i--) {
        if (!r->metrics[i].has_loss) continue;
        seen++;
        *from_step = r->metrics[i].step;
        if (isfinite(r->metrics[i].loss)) {
            sum += r->metrics[i].loss;
            cnt++;
        }
    }
    return cnt ? sum / cnt : NAN;
}

/* A plotted point far above its own curve's neighbourhood (a blow-up, a spike of 1e4) would
 * set the y scale alone and squash every curve into the bottom rows. So each point gets a
 * reference: the median of its run's points within OFFSCALE_NB columns either side (a spike
 * two columns wide does not move it). The plot's own height is the highest reference above the
 * lowest point; a point that rises above its reference by more than that height would more
 * than double the plot on its own: it is off-scale, clipped to the top row and marked. The
 * start of a falling curve is never off-scale (its neighbours are high too), nor a bump on a
 * plateau (small against the height). */
#define OFFSCALE_NB 3

static int cmp_dbl(const void *pa, const void *pb) {
    double a = *(const double *)pa, b = *(const double *)pb;
    return (a > b) - (a < b);
}

static void plot(const fp8t_run *runs, int n, int lo, int hi, int width, int height) {
    double *v = malloc(sizeof(double) * (size_t)n * width); /* [n][width] column means */
    char *off = calloc((size_t)n * width, 1);               /* [n][width] off-scale */
    char *grid = malloc((size_t)width * height);
    if (!v || !off || !grid) {
        free(v), free(off), free(grid);
        return;
    }
    double floor_y = INFINITY;
    for (int r = 0; r < n; r++) {
        for (int c = 0; c < width; c++) {
            /* the mean loss of the steps falling into column c */
            int s0 = lo + (int)((double)(hi - lo + 1) * c / width);
            int s1 = lo + (int)((double)(hi - lo + 1) * (c + 1) / width) - 1;
            if (s1 < s0) s1 = s0;
            double sum = 0;
            int cnt = 0;
            for (int s = s0; s <= s1; s++) {
                double x = loss_at(&runs[r], s);
                if (isfinite(x)) {
                    sum += x;
                    cnt++;
                }
            }
            v[r * width + c] = cnt ? sum / cnt : NAN;
            if (cnt && v[r * width + c] < floor_y) floor_y = v[r * width + c];
        }
    }
    double *ref = malloc(sizeof(double) * (size_t)n * width); /* [n][width] references */
    if (!ref) {
        free(v), free(off), free(grid);
        return;
    }
    double top_ref = -INFINITY;
    for (int r = 0; r < n; r++)
        for (int c = 0; c < width; c++) {
            double nb[2 * OFFSCALE_NB];
            int m = 0;
            for (int k = c - OFFSCALE_NB; k <= c + OFFSCALE_NB; k++)
                if (k != c && k >= 0 && k < width && isfinite(v[r * width + k]))
                    nb[m++] = v[r * width + k];
            ref[r * width + c] = NAN;
            if (!m || !isfinite(v[r * width + c])) continue;
            qsort(nb, (size_t)m, sizeof(double), cmp_dbl);
            ref[r * width + c] = (m & 1) ? nb[m / 2] : 0.5 * (nb[m / 2 - 1] + nb[m / 2]);
            if (ref[r * width + c] > top_ref) top_ref = ref[r * width + c];
        }
    const double height_y = top_ref - floor_y;
    double ymin = INFINITY, ymax = -INFINITY;
    int n_off = 0;
    for (int r = 0; r < n; r++)
        for (int c = 0; c < width; c++) {
            double y = v[r * width + c], rf = ref[r * width + c];
            if (!isfinite(y)) continue;
            if (isfinite(rf) && height_y > 0 && y - rf > height_y) {
                off[r * width + c] = 1;
                n_off++;
                continue;
            }
            if (y < ymin) ymin = y;
            if (y > ymax) ymax = y;
        }
    free(ref);
    if (!isfinite(ymin) || !isfinite(ymax)) {
        free(v), free(off), free(grid);
        return;
    }
    if (ymax - ymin < 1e-9) ymax = ymin + 1e-9;
    memset(grid, ' ', (size_t)width * height);
    for (int r = 0; r < n; r++) {
        for (int c = 0; c < width; c++) {
            double y = v[r * width + c];
            if (!isfinite(y)) continue;
            int row =
                off[r * width + c] ? 0 : (int)lround((ymax - y) / (ymax - ymin) * (height - 1));
            char *cell = &grid[(size_t)row * width + c];
            if (off[r * width + c])
                *cell = '^';
            else if (*cell != '^')
                *cell = (*cell == ' ' || *cell == MARKS[r]) ? MARKS[r] : '=';
        }
    }
    for (int row = 0; row < height; row++) {
        double y = ymax - (ymax - ymin) * row / (height - 1);
        printf("%8.3f |%.*s\n", y, width, grid + (size_t)row * width);
    }
    printf("%8s +", "");
    for (int c = 0; c < width; c++) putchar('-');
    printf("\n%8s  step %d%*s%d\n", "", lo, width - 12 > 0 ? width - 12 : 1, "", hi);
    printf("%8s  ", "");
    for (int r = 0; r < n; r++) printf("%c %s   ", MARKS[r], runs[r].label);
    printf("('=' where curves overlap)\n");
    if (n_off) {
        printf("%8s  ^ off-scale, clipped to the top row:", "");
        int shown = 0;
        for (int r = 0; r < n; r++)
            for (int c = 0; c < width; c++) {
                if (!off[r * width + c]) continue;
                if (shown++ == 6) printf(" ...");
                if (shown > 6) continue;
                int s0 = lo + (int)((double)(hi - lo + 1) * c / width);
                int s1 = lo + (int)((double)(hi - lo + 1) * (c + 1) / width) - 1;
                if (s1 < s0) s1 = s0;
                if (s1 > s0)
                    printf(" %s steps %d-%d mean %.4g;", runs[r].label, s0, s1, v[r * width + c]);
                else
                    printf(" %s step %d %.4g;", runs[r].label, s0, v[r * width + c]);
            }
        printf("\n");
    }
    free(v), free(off), free(grid);
}

int fp8t_cmd_curves(int argc, char **argv) {
    const char *paths[MAX_RUNS];
    curves_opts o = {.rows = 12, .width = 64, .height = 16};
    int n = 0, st = cli_parse(&SPEC, &o, sizeof(o), argc, argv, paths, &n);
    if (st >= 0) return st;
    const int rows = o.rows, width = o.width, height = o.height;
    if (n < 1) {
        fp8t_opt_help(stderr, &SPEC, &o);
        return 2;
    }
    fp8t_run runs[MAX_RUNS];
    char err[FP8T_ERR_LEN];
    for (int r = 0; r < n; r++) {
        if (fp8t_run_load(&runs[r], paths[r], err, sizeof(err)) != 0) {
            fprintf(stderr, "fp8train curves: %s\n", err);
            for (int k = 0; k < r; k++) fp8t_run_free(&runs[k]);
            return 2;
        }
    }
    /* the steps every run covers */
    int lo = -1, hi = -1;
    for (int r = 0; r < n; r++) {
        int a = -1, b = -1;
        for (int i = 0; i < runs[r].n_metrics; i++)
            if (runs[r].metrics[i].has_loss) {
                if (a < 0) a = runs[r].metrics[i].step;
                b = runs[r].metrics[i].step;
            }
        if (a < 0) {
            fprintf(stderr, "fp8train curves: %s has no training loss\n", runs[r].metrics_path);
            for (int k = 0; k < n; k++) fp8t_run_free(&runs[k]);
            return 2;
        }
        lo = r == 0 || a > lo ? a : lo;
        hi = r == 0 || b < hi ? b : hi;
    }
    int status = 0;
    if (lo > hi) {
        fprintf(stderr, "fp8train curves: the runs share no steps\n");
        status = 2;
        goto done;
    }
    printf("%8s", "step");
    for (int r = 0; r < n; r++) printf("  %12.12s", runs[r].label);
    if (n > 1) printf("  %9s", "gap");
    printf("\n");
    for (int k = 0; k < rows; k++) {
        int step = lo + (int)((double)(hi - lo) * k / (rows - 1) + 0.5);
        if (k > 0 && step == lo + (int)((double)(hi - lo) * (k - 1) / (rows - 1) + 0.5)) continue;
        printf("%8d", step);
        for (int r = 0; r < n; r++) printf("  %12.4f", loss_at(&runs[r], step));
        if (n > 1) {
            double a = loss_at(&runs[0], step), b = loss_at(&runs[n - 1], step);
            printf("  %+8.2f%%", 100 * (b - a) / fabs(a));
        }
        printf("\n");
    }
    printf("\n");
    plot(runs, n, lo, hi, width, height);
    printf("\nfinal loss (mean of the last 10%% of steps):\n");
    int from;
    double base = tail_mean(&runs[0], &from);
    for (int r = 0; r < n; r++) {
        double v = tail_mean(&runs[r], &from);
        printf("  %-24s %.4f (steps %d..)", runs[r].label, v, from);
        if (r > 0) printf("  gap vs %s: %+.2f%%", runs[0].label, 100 * (v - base) / fabs(base));
        printf("\n");
    }
done:
    for (int k = 0; k < n; k++) fp8t_run_free(&runs[k]);
    return status;
}
