/* compare, the micro half: the inspected operand sites whose FP8 error differs most between
 * two runs (stats.jsonl), and dumped tensors of the same step compared one by one (.npy). */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/compare.h"
#include "fp8train/error.h"
#include "fp8train/io.h"
#include "fp8train/stats.h"
#include "tools/compare_internal.h"
#include "util/fs.h"

#define MAX_DUMPS 4096
#define TOP_SITES 10

/* ---- inspection statistics ---- */

typedef struct {
    int layer;
    char module[8], gemm[8], tensor[16];
    int n;
    double cos, sqnr, under;
    char precision[12];
    int n_whatif;               /* rows with what-if data */
    int n_w[FP8T_WHATIF_COUNT]; /* ... with what-if w (mxfp8 only with whatif=all) */
    double wsqnr[FP8T_WHATIF_COUNT], wunder[FP8T_WHATIF_COUNT];
    int n_tile;           /* rows with tile data (block, rowwise) */
    double tsqnr, tunder; /* sum of the worst tile's SQNR; max worst underflow */
} site_agg;

static int key_cmp(int la, const char *ma, const char *ga, const char *ta, int lb, const char *mb,
                   const char *gb, const char *tb) {
    if (la != lb) return (la > lb) - (la < lb);
    int c = strcmp(ma, mb);
    if (c) return c;
    if ((c = strcmp(ga, gb))) return c;
    return strcmp(ta, tb);
}

static int cmp_site_key(const void *pa, const void *pb) {
    const fp8t_stat_row *a = pa, *b = pb;
    return key_cmp(a->layer, a->module, a->gemm, a->tensor, b->layer, b->module, b->gemm,
                   b->tensor);
}

static int has_step(const int *steps, int n, int s) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (steps[mid] == s) return 1;
        if (steps[mid] < s)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return 0;
}

static int cmp_int(const void *pa, const void *pb) {
    int a = *(const int *)pa, b = *(const int *)pb;
    return (a > b) - (a < b);
}

/* Sorted distinct steps of a run's stats rows. */
static int *stat_steps(const fp8t_run *run, int *n) {
    int *s = malloc(sizeof(int) * (size_t)(run->n_stats + 1));
    for (int i = 0; i < run->n_stats; i++) s[i] = run->stats[i].step;
    qsort(s, (size_t)run->n_stats, sizeof(int), cmp_int);
    int m = 0;
    for (int i = 0; i < run->n_stats; i++)
        if (m == 0 || s[m - 1] != s[i]) s[m++] = s[i];
    *n = m;
    return s;
}

/* Mean cosine / SQNR / underflow per operand site over the steps in `steps` (NULL: all). */
static site_agg *aggregate_sites(const fp8t_run *run, const int *steps, int n_steps, int *n_out) {
    fp8t_stat_row *rows = malloc(sizeof(fp8t_stat_row) * (size_t)(run->n_stats + 1));
    int m = 0;
    for (int i = 0; i < run->n_stats; i++) {
        const fp8t_stat_row *r = &run->stats[i];
        if (!r->is_operand || r->micro != 0 || !isfinite(r->cosine)) continue;
        if (steps && !has_step(steps, n_steps, r->step)) continue;
        rows[m++] = *r;
    }
    qsort(rows, (size_t)m, sizeof(fp8t_stat_row), cmp_site_key);
    site_agg *out = calloc((size_t)(m + 1), sizeof(site_agg));
    int k = 0;
    for (int i = 0; i < m; i++) {
        if (k == 0 || cmp_site_key(&rows[i], &rows[i - 1]) != 0) {
            site_agg *s = &out[k++];
            s->layer = rows[i].layer;
            memcpy(s->module, rows[i].module, sizeof(s->module));
            memcpy(s->gemm, rows[i].gemm, sizeof(s->gemm));
            memcpy(s->tensor, rows[i].tensor, sizeof(s->tensor));
            memcpy(s->precision, rows[i].precision, sizeof(s->precision));
        }
        site_agg *s = &out[k - 1];
        /* a row has what-if w when its underflow % is there (always a number then) */
        if (!isnan(rows[i].whatif_under[0])) {
            s->n_whatif++;
            for (int w = 0; w < FP8T_WHATIF_COUNT; w++) {
                if (isnan(rows[i].whatif_under[w])) continue;
                s->n_w[w]++;
                /* capped like sqnr; a NaN image (a NaN or Inf in an MX block) stays NaN */
                double ws = rows[i].whatif_sqnr[w];
                s->wsqnr[w] += isnan(ws) ? NAN : fmin(ws, SQNR_CAP_DB);
                s->wunder[w] += isfinite(rows[i].whatif_under[w]) ? rows[i].whatif_under[w] : 0;
            }
        }
        if (!isnan(rows[i].tile_sqnr_min_db)) {
            s->n_tile++;
            s->tsqnr += fmin(rows[i].tile_sqnr_min_db, SQNR_CAP_DB);
            if (isfinite(rows[i].tile_underflow_max_pct))
                s->tunder = fmax(s->tunder, rows[i].tile_underflow_max_pct);
        }
        double sq = rows[i].sqnr_db;
        if (!(sq < SQNR_CAP_DB)) sq = SQNR_CAP_DB; /* exact (1e300) or NaN-free cap */
        s->cos += rows[i].cosine;
        s->sqnr += sq;
        s->under += isfinite(rows[i].underflow_pct) ? rows[i].underflow_pct : 0;
        s->n++;
    }
    for (int i = 0; i < k; i++) {
        out[i].cos /= out[i].n;
        out[i].sqnr /= out[i].n;
        out[i].under /= out[i].n;
        out[i].tsqnr = out[i].n_tile ? out[i].tsqnr / out[i].n_tile : NAN;
        if (!out[i].n_tile) out[i].tunder = NAN;
        for (int w = 0; w < FP8T_WHATIF_COUNT; w++) {
            out[i].wsqnr[w] = out[i].n_w[w] ? out[i].wsqnr[w] / out[i].n_w[w] : NAN;
            out[i].wunder[w] = out[i].n_w[w] ? out[i].wunder[w] / out[i].n_w[w] : NAN;
        }
    }
    free(rows);
    *n_out = k;
    return out;
}

static int cmp_diff_score(const void *pa, const void *pb) {
    const fp8t_site_diff *a = pa, *b = pb;
    return (a->score < b->score) - (a->score > b->score); /* descending */
}

static void fill_diff(fp8t_site_diff *d, const site_agg *s) {
    d->whatif_run = 0;
    d->whatif_best = -1;
    for (int w = 0; w < FP8T_WHATIF_COUNT; w++) d->whatif_sqnr[w] = d->whatif_under[w] = NAN;
    d->tile_sqnr_a = d->tile_sqnr_b = d->tile_under_a = d->tile_under_b = NAN;
    d->layer = s->layer;
    memcpy(d->module, s->module, sizeof(d->module));
    memcpy(d->gemm, s->gemm, sizeof(d->gemm));
    memcpy(d->tensor, s->tensor, sizeof(d->tensor));
    d->n_steps = s->n;
}

/* Run `side`'s (0: A, 1: B) means of a site into d's columns; its what-if means too, unless
 * B's are already there (B, the run under test, wins). */
static void set_side(fp8t_site_diff *d, int side, const site_agg *s) {
    if (side == 0) {
        d->cos_a = s->cos, d->sqnr_a = s->sqnr, d->under_a = s->under;
        d->tile_sqnr_a = s->tsqnr, d->tile_under_a = s->tunder;
    } else {
        d->cos_b = s->cos, d->sqnr_b = s->sqnr, d->under_b = s->under;
        d->tile_sqnr_b = s->tsqnr, d->tile_under_b = s->tunder;
    }
    if (!s->n_whatif || d->whatif_run == 'B') return;
    d->whatif_run = side ? 'B' : 'A';
    memcpy(d->precision, s->precision, sizeof(d->precision));
    d->whatif_best = -1;
    for (int w = 0; w < FP8T_WHATIF_COUNT; w++) {
        d->whatif_sqnr[w] = s->wsqnr[w];
        d->whatif_under[w] = s->wunder[w];
        if (isfinite(s->wsqnr[w]) &&
            (d->whatif_best < 0 || s->wsqnr[w] > d->whatif_sqnr[d->whatif_best]))
            d->whatif_best = w;
    }
}

/* d[0..n) sorted worst score first into r, of which the TOP_SITES first are reported. */
static void keep_sites(fp8t_compare_result *r, fp8t_site_diff *d, int n, int have_stats) {
    qsort(d, (size_t)n, sizeof(fp8t_site_diff), cmp_diff_score);
    r->sites = d;
    r->n_sites = n < TOP_SITES ? n : TOP_SITES;
    r->have_stats = have_stats;
}

void compare_stats(fp8t_compare_result *r, const fp8t_run *a, const fp8t_run *b) {
    if (a->n_stats == 0 && b->n_stats == 0) return;
    if (a->n_stats && b->n_stats) {
        int na, nb;
        int *sa = stat_steps(a, &na), *sb = stat_steps(b, &nb);
        int *common = malloc(sizeof(int) * (size_t)(na + 1)), nc = 0;
        for (int i = 0; i < na; i++)
            if (has_step(sb, nb, sa[i])) common[nc++] = sa[i];
        free(sa);
        free(sb);
        if (nc == 0) {
            compare_add_note(
                r,
                "stats.jsonl of both runs share no inspected step%s%s: no per-tensor "
                "comparison (inspect the same steps in both runs)",
                "", "");
            free(common);
            return;
        }
        int ka, kb;
        site_agg *ga = aggregate_sites(a, common, nc, &ka),
                 *gb = aggregate_sites(b, common, nc, &kb);
        free(common);
        fp8t_site_diff *d = calloc((size_t)(ka + 1), sizeof(fp8t_site_diff));
        int n = 0, i = 0, j = 0;
        /* both lists are in key order: merge */
        while (i < ka && j < kb) {
            int c = key_cmp(ga[i].layer, ga[i].module, ga[i].gemm, ga[i].tensor, gb[j].layer,
                            gb[j].module, gb[j].gemm, gb[j].tensor);
            if (c < 0) {
                i++;
                continue;
            }
            if (c > 0) {
                j++;
                continue;
            }
            fp8t_site_diff *o = &d[n++];
            fill_diff(o, &ga[i]);
            o->n_steps = ga[i].n < gb[j].n ? ga[i].n : gb[j].n;
            set_side(o, 0, &ga[i]);
            set_side(o, 1, &gb[j]);
            o->score = o->sqnr_a - o->sqnr_b;
            i++;
            j++;
        }
        free(ga);
        free(gb);
        keep_sites(r, d, n, 2);
        return;
    }
    /* Only one run was inspected: rank its own sites, worst SQNR first. */
    const fp8t_run *run = a->n_stats ? a : b;
    int k;
    site_agg *g = aggregate_sites(run, NULL, 0, &k);
    fp8t_site_diff *d = calloc((size_t)(k + 1), sizeof(fp8t_site_diff));
    for (int i = 0; i < k; i++) {
        fp8t_site_diff *o = &d[i];
        fill_diff(o, &g[i]);
        o->cos_a = o->sqnr_a = o->under_a = o->cos_b = o->sqnr_b = o->under_b = NAN;
        set_side(o, run == a ? 0 : 1, &g[i]);
        o->score = -g[i].sqnr;
    }
    free(g);
    keep_sites(r, d, k, 1);
}

/* ---- dumps ---- */

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int cmp_dump_cos(const void *pa, const void *pb) {
    const fp8t_dump_diff *a = pa, *b = pb;
    if (a->cosine != b->cosine) return (a->cosine > b->cosine) - (a->cosine < b->cosine);
    return (a->step > b->step) - (a->step < b->step);
}

/* dir_a/stepdir/file against dir_b/stepdir/file, appended to r->dumps when both are FP32 of
 * the same shape. */
static void compare_one_dump(fp8t_compare_result *r, const char *dir_a, const char *dir_b,
                             const char *stepdir, const char *file, double cosine_flag) {
    char pa[FP8T_RUN_PATH * 2], pb[FP8T_RUN_PATH * 2], err[512];
    snprintf(pa, sizeof(pa), "%s/%s/%s", dir_a, stepdir, file);
    snprintf(pb, sizeof(pb), "%s/%s/%s", dir_b, stepdir, file);
    char da[16], db[16];
    int ndim_a, ndim_b;
    int64_t sha[8], shb[8];
    void *xa = NULL, *xb = NULL;
    size_t bytes_a, bytes_b;
    if (fp8t_npy_read(pb, db, &ndim_b, shb, &xb, &bytes_b, err, sizeof(err)))
        return; /* not in B */
    if (fp8t_npy_read(pa, da, &ndim_a, sha, &xa, &bytes_a, err, sizeof(err))) {
        snprintf(r->dump_note, sizeof(r->dump_note), "%.250s", err);
        free(xb);
        return;
    }
    int same = strcmp(da, "<f4") == 0 && strcmp(db, "<f4") == 0 && bytes_a == bytes_b &&
               ndim_a == ndim_b;
    for (int d = 0; same && d < ndim_a; d++) same = sha[d] == shb[d];
    if (!same) {
        snprintf(r->dump_note, sizeof(r->dump_note),
                 "%.180s: dtype or shape differs between the runs (same model and batch?)", pa);
    } else if (r->n_dumps < MAX_DUMPS) {
        size_t n = bytes_a / sizeof(float);
        fp8t_stats st;
        fp8t_compare_stats(&st, (const float *)xa, (const float *)xb, n);
        fp8t_dump_diff *o = &r->dumps[r->n_dumps++];
        memset(o, 0, sizeof(*o));
        o->step = atoi(stepdir + 5);
        snprintf(o->name, sizeof(o->name), "%.*s", (int)(strlen(file) - 4), file);
        o->numel = n;
        o->cosine = st.cosine;
        o->mse = st.mse;
        o->sqnr_db = st.sqnr_db;
        o->rel_l2 = st.l2 > 0 ? sqrt(st.mse * (double)n) / st.l2 : (st.mse > 0 ? INFINITY : 0);
        o->flagged = !(st.cosine >= cosine_flag);
        r->n_dumps_flagged += o->flagged;
    }
    free(xa);
    free(xb);
}

/* Every step_NNNNNN/ of dir_a that dir_b has too, FP32 dumps one by one: r->dumps (sorted worst
 * cosine first), n_dumps, n_dumps_flagged, dump_note. Nothing when dir_a cannot be opened. */
static void compare_dump_dirs(fp8t_compare_result *r, const char *dir_a, const char *dir_b,
                              double cosine_flag) {
    DIR *d = opendir(dir_a);
    if (!d) return;
    r->dumps = calloc(MAX_DUMPS, sizeof(fp8t_dump_diff));
    struct dirent *e;
    int common_steps = 0;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "step_", 5) != 0) continue;
        char sub[FP8T_RUN_PATH * 2];
        snprintf(sub, sizeof(sub), "%s/%s", dir_b, e->d_name);
        DIR *db = opendir(sub);
        if (!db) continue;
        closedir(db);
        snprintf(sub, sizeof(sub), "%s/%s", dir_a, e->d_name);
        DIR *da = opendir(sub);
        if (!da) continue;
        common_steps++;
        struct dirent *f;
        while ((f = readdir(da))) {
            if (!ends_with(f->d_name, ".npy") || ends_with(f->d_name, ".fp8.npy") ||
                ends_with(f->d_name, ".scale_inv.npy"))
                continue;
            compare_one_dump(r, dir_a, dir_b, e->d_name, f->d_name, cosine_flag);
        }
        closedir(da);
    }
    closedir(d);
    if (common_steps == 0 && !r->dump_note[0])
        snprintf(r->dump_note, sizeof(r->dump_note),
                 "both runs have dumps but of no common step: dump the same steps "
                 "(--inspect 'start=S,end=S,dump=1') in both");
    qsort(r->dumps, (size_t)r->n_dumps, sizeof(fp8t_dump_diff), cmp_dump_cos);
}

void compare_dumps(fp8t_compare_result *r, const fp8t_run *a, const fp8t_run *b,
                   const fp8t_compare_cfg *cfg) {
    if (!a->dumps_dir[0] || !b->dumps_dir[0]) return;
    compare_dump_dirs(r, a->dumps_dir, b->dumps_dir, cfg->cosine_flag);
}

int fp8t_compare_dump_dirs(fp8t_dump_diff **diffs, int *n, int *n_flagged, const char *dumps_a,
                           const char *dumps_b, double cosine_flag, char *note, size_t notelen,
                           char *err, size_t errlen) {
    *diffs = NULL;
    *n = *n_flagged = 0;
    if (note && notelen) note[0] = 0;
    const char *dirs[2] = {dumps_a, dumps_b};
    for (int i = 0; i < 2; i++)
        if (!dirs[i] || !fp8t_is_dir(dirs[i]) || strlen(dirs[i]) >= FP8T_RUN_PATH) {
            return fp8t_errorf(err, errlen,
                               "%s: not a readable dump directory (inspect with dump=1 writes "
                               "OUT/dumps)",
                               dirs[i] ? dirs[i] : "(null)");
        }
    fp8t_compare_result r;
    memset(&r, 0, sizeof(r));
    compare_dump_dirs(&r, dumps_a, dumps_b, cosine_flag);
    *diffs = r.dumps;
    *n = r.n_dumps;
    *n_flagged = r.n_dumps_flagged;
    if (note && notelen) snprintf(note, notelen, "%s", r.dump_note);
    return 0;
}
