/* Reading a run's logs: metrics.jsonl, events.jsonl, stats.jsonl, and locating a run's files.
 * Readers are lenient where a crashing or foreign writer can leave odd but meaningful text
 * (bare nan/inf tokens, a truncated last line) and strict elsewhere, with errors naming the
 * file, the line and the expected form. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "fp8train/compare.h"
#include "fp8train/error.h"
#include "util/fs.h"

/* ---- JSONL iteration ---- */

/* Copy line into out replacing bare non-JSON number words (nan, -nan, inf, -Infinity, ...)
 * outside strings by null, so C printf("%f") output of a non-finite value still parses. */
static void sanitize_line(char *out, const char *line) {
    int in_str = 0;
    const char *p = line;
    char *o = out;
    while (*p) {
        char c = *p;
        if (in_str) {
            *o++ = c;
            if (c == '\\' && p[1]) {
                *o++ = p[1];
                p += 2;
                continue;
            }
            if (c == '"') in_str = 0;
            p++;
            continue;
        }
        if (c == '"') {
            in_str = 1;
            *o++ = c;
            p++;
            continue;
        }
        if ((c >= '0' && c <= '9') || (c == '-' && p[1] >= '0' && p[1] <= '9')) {
            /* a number, exponent letters included */
            while ((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E' || *p == '-' ||
                   *p == '+')
                *o++ = *p++;
            continue;
        }
        int neg =
            (c == '-' || c == '+') && (p[1] == 'n' || p[1] == 'N' || p[1] == 'i' || p[1] == 'I');
        const char *w = neg ? p + 1 : p;
        if ((*w >= 'a' && *w <= 'z') || (*w >= 'A' && *w <= 'Z')) {
            const char *e = w;
            while ((*e >= 'a' && *e <= 'z') || (*e >= 'A' && *e <= 'Z')) e++;
            size_t len = (size_t)(e - w);
            int keep = (len == 4 && strncmp(w, "true", 4) == 0) ||
                       (len == 5 && strncmp(w, "false", 5) == 0) ||
                       (len == 4 && strncmp(w, "null", 4) == 0);
            if (keep && !neg) {
                memcpy(o, w, len);
                o += len;
            } else {
                memcpy(o, "null", 4);
                o += 4;
            }
            p = e;
            continue;
        }
        *o++ = c;
        p++;
    }
    *o = 0;
}

typedef int (*jsonl_row_fn)(void *ctx, const cJSON *obj, const char *path, int lineno, char *err,
                            size_t errlen);

static int is_blank(const char *s) {
    for (; *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\r' && *s != '\n') return 0;
    return 1;
}

static int jsonl_each(const char *path, jsonl_row_fn fn, void *ctx, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        return fp8t_errorf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    }
    char *line = NULL, *clean = NULL;
    size_t cap = 0, clean_cap = 0;
    ssize_t len;
    int lineno = 0, rc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (is_blank(line)) continue;
        if ((size_t)len * 2 + 8 > clean_cap) { /* "-inf" -> "null" can grow the text */
            clean_cap = (size_t)len * 2 + 8;
            char *nc = realloc(clean, clean_cap);
            if (!nc) {
                fp8t_errorf(err, errlen, "%s: out of memory", path);
                rc = -1;
                break;
            }
            clean = nc;
        }
        sanitize_line(clean, line);
        cJSON *obj = cJSON_Parse(clean);
        if (!obj || !cJSON_IsObject(obj)) {
            cJSON_Delete(obj);
            int last = line[len - 1] != '\n';
            int c = fgetc(f);
            if (c == EOF && last) { /* a writer killed mid-line: keep what came before */
                fp8t_warnf("%s:%d: truncated last line skipped", path, lineno);
                break;
            }
            ungetc(c, f);
            fp8t_errorf(err, errlen,
                        "%s:%d: not a JSON object (\"%.60s%s\"); a .jsonl file holds one JSON "
                        "object per line: fix or delete that line",
                        path, lineno, line, len > 60 ? "..." : "");
            rc = -1;
            break;
        }
        rc = fn(ctx, obj, path, lineno, err, errlen);
        cJSON_Delete(obj);
        if (rc) break;
    }
    free(line);
    free(clean);
    fclose(f);
    return rc;
}

/* A number field: numbers as they are; "nan"/"inf"/"-inf" strings and null as NaN/Inf;
 * absent as NaN with *present = 0. */
const char *const fp8t_whatif_names[FP8T_WHATIF_COUNT] = {
    "current_e4m3", "current_e5m2", "block128_e4m3", "block128_e5m2", "mxfp8"};

static double get_num(const cJSON *obj, const char *key, int *present) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (present) *present = it != NULL;
    if (!it) return NAN;
    if (cJSON_IsNumber(it)) return it->valuedouble;
    if (cJSON_IsString(it) && it->valuestring) {
        const char *s = it->valuestring;
        int neg = *s == '-';
        if (neg || *s == '+') s++;
        if (strncasecmp(s, "inf", 3) == 0) return neg ? -INFINITY : INFINITY;
        char *end;
        double v = strtod(it->valuestring, &end);
        return end != it->valuestring ? v : NAN;
    }
    return NAN;
}

static const char *get_str(const cJSON *obj, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

/* Grow *arr (elements of size sz) to hold at least n+1. */
static int grow(void **arr, int *cap, int n, size_t sz) {
    if (n < *cap) return 0;
    int nc = *cap ? *cap * 2 : 256;
    void *p = realloc(*arr, (size_t)nc * sz);
    if (!p) return -1;
    *arr = p;
    *cap = nc;
    return 0;
}

/* ---- metrics.jsonl ---- */

typedef struct {
    fp8t_metric_row *rows;
    int n, cap;
    int *order; /* line order of each row, for a stable sort */
    int order_cap;
} metrics_ctx;

static int metrics_row(void *vctx, const cJSON *obj, const char *path, int lineno, char *err,
                       size_t errlen) {
    metrics_ctx *c = vctx;
    int has_step, has_loss, has_val;
    double step = get_num(obj, "step", &has_step);
    double loss = get_num(obj, "loss", &has_loss);
    if (!has_loss) loss = get_num(obj, "train_loss", &has_loss);
    double val = get_num(obj, "val_loss", &has_val);
    if (!has_step && !has_loss && !has_val) return 0; /* a summary/header row: not a step */
    if (!has_step || !isfinite(step) || step < 0 || step > 2e9) {
        return fp8t_errorf(err, errlen,
                           "%s:%d: a metrics row needs a non-negative integer \"step\" (expected "
                           "{\"step\": N, \"loss\": X, ...})",
                           path, lineno);
    }
    if (grow((void **)&c->rows, &c->cap, c->n, sizeof(fp8t_metric_row)) ||
        grow((void **)&c->order, &c->order_cap, c->n, sizeof(int))) {
        return fp8t_errorf(err, errlen, "%s: out of memory", path);
    }
    fp8t_metric_row *r = &c->rows[c->n];
    r->step = (int)step;
    r->has_loss = has_loss;
    r->loss = isfinite(loss) ? loss : NAN;
    r->val_loss = has_val ? val : NAN;
    r->lr = get_num(obj, "lr", NULL);
    r->grad_norm = get_num(obj, "grad_norm", NULL);
    c->order[c->n] = c->n;
    c->n++;
    return 0;
}

static fp8t_metric_row *g_sort_rows; /* qsort has no context argument */
static int cmp_metric_order(const void *pa, const void *pb) {
    int ia = *(const int *)pa, ib = *(const int *)pb;
    int sa = g_sort_rows[ia].step, sb = g_sort_rows[ib].step;
    if (sa != sb) return (sa > sb) - (sa < sb);
    return (ia > ib) - (ia < ib);
}

int fp8t_metrics_read(fp8t_metric_row **rows, int *n, const char *path, char *err,
                      size_t errlen) {
    metrics_ctx c = {0};
    *rows = NULL;
    *n = 0;
    if (jsonl_each(path, metrics_row, &c, err, errlen)) {
        free(c.rows);
        free(c.order);
        return -1;
    }
    /* Sort by step keeping file order among equal steps, then merge duplicates: a resumed
     * run logs some steps twice (the later line wins), and a validation row may share the
     * step of a training row (fields merge). */
    g_sort_rows = c.rows;
    if (c.n > 1) qsort(c.order, (size_t)c.n, sizeof(int), cmp_metric_order);
    fp8t_metric_row *out = malloc(sizeof(fp8t_metric_row) * (size_t)(c.n ? c.n : 1));
    int m = 0;
    for (int k = 0; k < c.n; k++) {
        const fp8t_metric_row *r = &c.rows[c.order[k]];
        if (m > 0 && out[m - 1].step == r->step) {
            fp8t_metric_row *o = &out[m - 1];
            if (r->has_loss) {
                o->has_loss = 1;
                o->loss = r->loss;
            }
            if (!isnan(r->val_loss)) o->val_loss = r->val_loss;
            if (!isnan(r->lr)) o->lr = r->lr;
            if (!isnan(r->grad_norm)) o->grad_norm = r->grad_norm;
        } else {
            out[m++] = *r;
        }
    }
    free(c.rows);
    free(c.order);
    *rows = out;
    *n = m;
    return 0;
}

/* ---- events.jsonl ---- */

typedef struct {
    fp8t_event_row *rows;
    int n, cap;
} events_ctx;

static int events_row(void *vctx, const cJSON *obj, const char *path, int lineno, char *err,
                      size_t errlen) {
    (void)lineno;
    events_ctx *c = vctx;
    if (grow((void **)&c->rows, &c->cap, c->n, sizeof(fp8t_event_row))) {
        return fp8t_errorf(err, errlen, "%s: out of memory", path);
    }
    fp8t_event_row *e = &c->rows[c->n++];
    memset(e, 0, sizeof(*e));
    int has_step;
    double step = get_num(obj, "step", &has_step);
    e->step = (has_step && isfinite(step) && step >= 0 && step < 2e9) ? (int)step : -1;
    const char *kind = get_str(obj, "kind");
    if (!kind) kind = get_str(obj, "type");
    if (!kind) kind = get_str(obj, "event");
    snprintf(e->kind, sizeof(e->kind), "%s", kind ? kind : "event");
    const char *msg = get_str(obj, "message");
    if (!msg) msg = get_str(obj, "msg");
    if (!msg) msg = get_str(obj, "detail");
    if (!msg) msg = get_str(obj, "where");
    snprintf(e->message, sizeof(e->message), "%s", msg ? msg : "");
    return 0;
}

int fp8t_events_read(fp8t_event_row **rows, int *n, const char *path, char *err, size_t errlen) {
    events_ctx c = {0};
    *rows = NULL;
    *n = 0;
    if (jsonl_each(path, events_row, &c, err, errlen)) {
        free(c.rows);
        return -1;
    }
    *rows = c.rows;
    *n = c.n;
    return 0;
}

/* ---- stats.jsonl ---- */

typedef struct {
    fp8t_stat_row *rows;
    int n, cap;
} stats_ctx;

static int stats_row(void *vctx, const cJSON *obj, const char *path, int lineno, char *err,
                     size_t errlen) {
    stats_ctx *c = vctx;
    int has_step, has_layer;
    double step = get_num(obj, "step", &has_step);
    double layer = get_num(obj, "layer", &has_layer);
    const char *module = get_str(obj, "module"), *gemm = get_str(obj, "gemm"),
               *tensor = get_str(obj, "tensor");
    if (!has_step || !has_layer || !module || !gemm || !tensor || !isfinite(step) ||
        !isfinite(layer) || step < 0 || step > 2e9 || fabs(layer) > 1e6) {
        return fp8t_errorf(
            err, errlen,
            "%s:%d: a stats row needs \"step\", \"layer\", \"module\", \"gemm\" and "
            "\"tensor\" (as written by --inspect)",
            path, lineno);
    }
    if (grow((void **)&c->rows, &c->cap, c->n, sizeof(fp8t_stat_row))) {
        return fp8t_errorf(err, errlen, "%s: out of memory", path);
    }
    fp8t_stat_row *r = &c->rows[c->n++];
    memset(r, 0, sizeof(*r));
    r->step = (int)step;
    double micro = get_num(obj, "micro", NULL);
    r->micro = isfinite(micro) && fabs(micro) < 1e6 ? (int)micro : 0;
    r->layer = (int)layer;
    snprintf(r->module, sizeof(r->module), "%s", module);
    snprintf(r->gemm, sizeof(r->gemm), "%s", gemm);
    snprintf(r->tensor, sizeof(r->tensor), "%s", tensor);
    const char *prec = get_str(obj, "precision");
    snprintf(r->precision, sizeof(r->precision), "%s", prec ? prec : "");
    r->is_operand = strcmp(tensor, "input") == 0 || strcmp(tensor, "weight") == 0 ||
                    strcmp(tensor, "grad_output") == 0;
    r->amax = get_num(obj, "amax", NULL);
    r->underflow_pct = get_num(obj, "underflow_pct", NULL);
    r->saturation_pct = get_num(obj, "saturation_pct", NULL);
    r->cosine = get_num(obj, "cosine", NULL);
    r->sqnr_db = get_num(obj, "sqnr_db", NULL);
    r->scale = get_num(obj, "scale", NULL);
    r->n_nan = get_num(obj, "n_nan", NULL);
    r->n_inf = get_num(obj, "n_inf", NULL);
    r->tile_sqnr_min_db = get_num(obj, "tile_sqnr_min_db", NULL);
    r->tile_underflow_max_pct = get_num(obj, "tile_underflow_max_pct", NULL);
    const cJSON *wi = cJSON_GetObjectItemCaseSensitive(obj, "whatif");
    for (int k = 0; k < FP8T_WHATIF_COUNT; k++) {
        const cJSON *w = cJSON_IsObject(wi)
                             ? cJSON_GetObjectItemCaseSensitive(wi, fp8t_whatif_names[k])
                             : NULL;
        r->whatif_sqnr[k] = w ? get_num(w, "sqnr_db", NULL) : NAN;
        r->whatif_under[k] = w ? get_num(w, "underflow_pct", NULL) : NAN;
        r->whatif_sat[k] = w ? get_num(w, "saturation_pct", NULL) : NAN;
    }
    return 0;
}

int fp8t_stats_read(fp8t_stat_row **rows, int *n, const char *path, char *err, size_t errlen) {
    stats_ctx c = {0};
    *rows = NULL;
    *n = 0;
    if (jsonl_each(path, stats_row, &c, err, errlen)) {
        free(c.rows);
        return -1;
    }
    *rows = c.rows;
    *n = c.n;
    return 0;
}

/* ---- a run ---- */

/* Last path component of dir (trailing slashes ignored) into out. */
static void base_name(char *out, size_t len, const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t s = n;
    while (s > 0 && dir[s - 1] != '/') s--;
    size_t k = n - s;
    if (k >= len) k = len - 1;
    memcpy(out, dir + s, k);
    out[k] = 0;
    if (!out[0]) snprintf(out, len, "run");
}

int fp8t_run_load(fp8t_run *run, const char *path, char *err, size_t errlen) {
    memset(run, 0, sizeof(*run));
    if (!path || !*path) {
        return fp8t_errorf(err, errlen,
                           "empty run path: pass a run directory (fp8train train --out DIR)");
    }
    if (strlen(path) + 32 >= FP8T_RUN_PATH) {
        return fp8t_errorf(err, errlen, "%.80s...: path too long", path);
    }
    if (fp8t_is_dir(path)) {
        snprintf(run->dir, sizeof(run->dir), "%s", path);
        snprintf(run->metrics_path, sizeof(run->metrics_path), "%s/metrics.jsonl", path);
        if (!fp8t_is_regular_file(run->metrics_path)) {
            return fp8t_errorf(
                err, errlen,
                "%s: no metrics.jsonl in this directory; pass a run directory written "
                "by `fp8train train --out DIR` or the path of a metrics.jsonl",
                path);
        }
    } else if (fp8t_is_regular_file(path)) {
        snprintf(run->metrics_path, sizeof(run->metrics_path), "%s", path);
        const char *slash = strrchr(path, '/');
        if (slash)
            snprintf(run->dir, sizeof(run->dir), "%.*s", (int)(slash - path), path);
        else
            snprintf(run->dir, sizeof(run->dir), ".");
        if (!run->dir[0]) snprintf(run->dir, sizeof(run->dir), "/");
    } else {
        return fp8t_errorf(err, errlen,
                           "%s: no such file or directory; pass a run directory written by "
                           "`fp8train train --out DIR` or the path of a metrics.jsonl",
                           path);
    }
    base_name(run->label, sizeof(run->label), fp8t_is_dir(path) ? path : run->dir);

    if (fp8t_metrics_read(&run->metrics, &run->n_metrics, run->metrics_path, err, errlen))
        goto fail;
    int n_loss = 0;
    for (int i = 0; i < run->n_metrics; i++) n_loss += run->metrics[i].has_loss;
    if (n_loss == 0) {
        fp8t_errorf(err, errlen,
                    "%s: no row with a \"loss\" field (%d rows); is the run empty? train it "
                    "for a few steps first",
                    run->metrics_path, run->n_metrics);
        goto fail;
    }

    char p[FP8T_RUN_PATH + 32];
    snprintf(p, sizeof(p), "%s/events.jsonl", run->dir);
    if (fp8t_is_regular_file(p) && fp8t_events_read(&run->events, &run->n_events, p, err, errlen))
        goto fail;

    const char *stats_cands[] = {"stats.jsonl", "inspect/stats.jsonl"};
    const char *dump_cands[] = {"dumps", "inspect/dumps"};
    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof(p), "%s/%s", run->dir, stats_cands[k]);
        if (!run->stats_path[0] && fp8t_is_regular_file(p))
            snprintf(run->stats_path, FP8T_RUN_PATH, "%.1000s", p);
        snprintf(p, sizeof(p), "%s/%s", run->dir, dump_cands[k]);
        if (!run->dumps_dir[0] && fp8t_is_dir(p))
            snprintf(run->dumps_dir, FP8T_RUN_PATH, "%.1000s", p);
    }
    if (run->stats_path[0] &&
        fp8t_stats_read(&run->stats, &run->n_stats, run->stats_path, err, errlen))
        goto fail;
    return 0;
fail:
    fp8t_run_free(run);
    return -1;
}

void fp8t_run_free(fp8t_run *run) {
    if (!run) return;
    free(run->metrics);
    free(run->events);
    free(run->stats);
    run->metrics = NULL;
    run->events = NULL;
    run->stats = NULL;
    run->n_metrics = run->n_events = run->n_stats = 0;
}

const fp8t_metric_row *fp8t_run_metric_at(const fp8t_run *run, int step) {
    int lo = 0, hi = run->n_metrics - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int s = run->metrics[mid].step;
        if (s == step) return &run->metrics[mid];
        if (s < step)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}
