/* `fp8train tensorboard RUN [--out DIR]`: TensorBoard event files from a run's logs after the
 * fact, for runs trained without --tensorboard (a bisect's experiments, older runs): the
 * scalars of metrics.jsonl and the statistics of stats.jsonl under the tags a live
 * `train --tensorboard` writes, one event per metrics row, with a session start wherever the
 * steps go back (a shadow rollback's re-run). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_args.h"
#include "fp8train/error.h"
#include "fp8train/io.h"
#include "fp8train/tensorboard.h"
#include "util/fs.h"

#define CMD "tensorboard"

typedef struct {
    const char *out;
} tb_opts;

static const fp8t_opt OPTS[] = {
    {.name = "out",
     .arg = "DIR",
     .type = FP8T_OPT_STR,
     FP8T_OPT_FIELD(tb_opts, out),
     .dflt = "RUN/tb",
     .help = "where the event file goes; a new file is added there, never "
             "overwritten"},
};

static const fp8t_opt_spec SPEC = {
    .cmd = CMD,
    .usage = "RUN [--out DIR]",
    .about = "Writes TensorBoard event files for a run directory from its metrics.jsonl\n"
             "(loss, val_loss, lr, grad_norm, tokens_per_s, shadow/drift gaps) and, when\n"
             "present, stats.jsonl (--inspect: inspect/<site>/<stat> with underflow_pct,\n"
             "saturation_pct, sqnr_db, scale, amax): the tags train --tensorboard writes\n"
             "live.\n",
    .epilog = "Then: tensorboard --logdir DIR. Exit status: 0, or 2 on bad input.\n",
    .opts = OPTS,
    .n_opts = (int)(sizeof(OPTS) / sizeof(OPTS[0])),
    .max_pos = 1,
    .wrap = CLI_HELP_WRAP,
};

/* The JSON objects of a .jsonl file, in order (NULL and err when it cannot be read or a
 * complete line is not an object; a truncated last line, as a killed writer leaves, is
 * skipped). */
static cJSON *read_jsonl(const char *path, char *err, size_t errlen) {
    char *text = NULL;
    size_t len = 0;
    if (fp8t_read_file(path, &text, &len, err, errlen) != 0) return NULL;
    cJSON *arr = cJSON_CreateArray();
    int line_no = 0;
    for (char *line = text, *nl; arr && line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl) *nl = 0;
        line_no++;
        if (!*line) continue;
        cJSON *o = cJSON_Parse(line);
        if (!cJSON_IsObject(o)) {
            cJSON_Delete(o);
            if (!nl) break; /* the last line, cut short */
            fp8t_errorf(err, errlen, "%s:%d: not a JSON object (is this a run's log?)", path,
                        line_no);
            cJSON_Delete(arr);
            arr = NULL;
            break;
        }
        cJSON_AddItemToArray(arr, o);
    }
    free(text);
    return arr;
}

static int num(const cJSON *o, const char *k, double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(x)) return 0;
    *v = x->valuedouble;
    return 1;
}

static const char *str(const cJSON *o, const char *k) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

/* Queue the metrics row's scalars as runlog_tb_step does live: unmeasured values left out, a
 * non-finite loss or gradient norm (null in the row) written as NaN. */
static void add_metrics(fp8t_tb_writer *w, const cJSON *row) {
    static const char *always[] = {"loss", "lr", "grad_norm"};
    static const char *optional[] = {"tokens_per_s", "val_loss", "shadow_loss", "shadow_gap",
                                     "drift_gap"};
    double v;
    for (size_t i = 0; i < sizeof(always) / sizeof(always[0]); i++) {
        if (num(row, always[i], &v))
            fp8t_tb_add(w, always[i], v);
        else if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(row, always[i])))
            fp8t_tb_add(w, always[i], NAN);
    }
    for (size_t i = 0; i < sizeof(optional) / sizeof(optional[0]); i++)
        if (num(row, optional[i], &v)) fp8t_tb_add(w, optional[i], v);
}

/* The statistics of stats.jsonl, micro-batch 0, one entry per (step, site): a resumed run
 * appends the rows of the steps it re-runs, and the last row of a site is the one that
 * stands (as TensorBoard keeps the last take). Sorted by step, then site. */
typedef struct {
    int step;
    long order;     /* line in the file */
    char site[160]; /* layerNN.module.gemm.tensor, head.head.gemm.tensor */
    const cJSON *row;
} stat_row;

static int cmp_stat(const void *pa, const void *pb) {
    const stat_row *a = pa, *b = pb;
    if (a->step != b->step) return a->step < b->step ? -1 : 1;
    int c = strcmp(a->site, b->site);
    if (c) return c;
    return a->order < b->order ? -1 : a->order > b->order;
}

/* *out: the index (sorted, duplicates dropped); -1 with err on a malformed row. */
static int index_stats(const cJSON *stats, stat_row **out, int *n_out, char *err, size_t errlen) {
    int n = cJSON_GetArraySize(stats), k = 0;
    stat_row *r = calloc(n > 0 ? (size_t)n : 1, sizeof(*r));
    if (!r) {
        return fp8t_errorf(err, errlen, "out of memory indexing stats.jsonl");
    }
    const cJSON *row;
    long line = 0;
    cJSON_ArrayForEach(row, stats) {
        line++;
        double step, micro, layer;
        const char *module = str(row, "module"), *gemm = str(row, "gemm"),
                   *tensor = str(row, "tensor");
        if (!num(row, "step", &step) || !num(row, "micro", &micro) ||
            !num(row, "layer", &layer) || !module || !gemm || !tensor) {
            fp8t_errorf(err, errlen,
                        "stats.jsonl: row %ld lacks step/micro/layer/module/gemm/"
                        "tensor",
                        line);
            free(r);
            return -1;
        }
        if (micro != 0) continue; /* one value per step and tag: the first micro-batch's */
        r[k].step = (int)step;
        r[k].order = line;
        r[k].row = row;
        if (layer < 0)
            snprintf(r[k].site, sizeof(r[k].site), "head.%s.%s.%s", module, gemm, tensor);
        else
            snprintf(r[k].site, sizeof(r[k].site), "layer%02d.%s.%s.%s", (int)layer, module, gemm,
                     tensor);
        k++;
    }
    qsort(r, (size_t)k, sizeof(*r), cmp_stat);
    int m = 0; /* keep the last row of each (step, site): the one before a change of key */
    for (int i = 0; i < k; i++)
        if (i + 1 == k || r[i + 1].step != r[i].step || strcmp(r[i + 1].site, r[i].site) != 0)
            r[m++] = r[i];
    *out = r;
    *n_out = m;
    return 0;
}

/* Queue the statistics of `step` as the inspector's sink does live; returns how many. */
static int add_stats(fp8t_tb_writer *w, const stat_row *idx, int n, int step) {
    static const char *stat_keys[] = {"underflow_pct", "saturation_pct", "sqnr_db", "scale",
                                      "amax"};
    int lo = 0, hi = n, added = 0;
    while (lo < hi) { /* the first entry of the step */
        int mid = lo + (hi - lo) / 2;
        if (idx[mid].step < step)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (int i = lo; i < n && idx[i].step == step; i++)
        for (size_t k = 0; k < sizeof(stat_keys) / sizeof(stat_keys[0]); k++) {
            double v;
            if (num(idx[i].row, stat_keys[k], &v) && isfinite((float)v)) {
                char tag[256];
                snprintf(tag, sizeof(tag), "inspect/%s/%s", idx[i].site, stat_keys[k]);
                fp8t_tb_add(w, tag, v);
                added++;
            }
        }
    return added;
}

int fp8t_cmd_tensorboard(int argc, char **argv) {
    tb_opts o = {.out = NULL};
    const char *run = NULL;
    int n_pos = 0, st = cli_parse(&SPEC, &o, sizeof(o), argc, argv, &run, &n_pos);
    if (st >= 0) return st;
    const char *out = o.out;
    if (!run) {
        fp8t_opt_help(stderr, &SPEC, &o);
        return 2;
    }
    char mpath[1100], spath[1100], dir[1100], err[1536] = "";
    snprintf(mpath, sizeof(mpath), "%s/metrics.jsonl", run);
    snprintf(spath, sizeof(spath), "%s/stats.jsonl", run);
    snprintf(dir, sizeof(dir), "%s", out ? out : "");
    if (!out) snprintf(dir, sizeof(dir), "%s/tb", run);
    if (!fp8t_is_regular_file(mpath)) {
        fprintf(stderr,
                "fp8train " CMD ": %s has no metrics.jsonl: name a run directory "
                "(fp8train train --out DIR)\n",
                run);
        return 2;
    }
    cJSON *metrics = read_jsonl(mpath, err, sizeof(err)), *stats = NULL;
    int rc = 2, rows = 0, n_stats = 0, n_idx = 0;
    stat_row *idx = NULL;
    fp8t_tb_writer *w = NULL;
    if (!metrics) goto fail;
    if (fp8t_is_regular_file(spath)) {
        stats = read_jsonl(spath, err, sizeof(err));
        if (!stats || index_stats(stats, &idx, &n_idx, err, sizeof(err)) != 0) goto fail;
    }
    /* every input checked before anything is written */
    const cJSON *row;
    int line = 0;
    cJSON_ArrayForEach(row, metrics) {
        double s;
        line++;
        if (!num(row, "step", &s) || s < 0 || s > 2e9) {
            snprintf(err, sizeof(err), "%s: row %d has no step (is this a run's metrics.jsonl?)",
                     mpath, line);
            goto fail;
        }
    }
    w = fp8t_tb_open(dir, err, sizeof(err));
    if (!w) goto fail;
    int prev = -1;
    cJSON_ArrayForEach(row, metrics) {
        double s = 0;
        num(row, "step", &s); /* checked above */
        const int step = (int)s;
        /* the first row, and any row whose step goes back: a (re)start at that step */
        if ((prev < 0 || step <= prev) && fp8t_tb_session_start(w, step, err, sizeof(err)) != 0)
            goto fail;
        prev = step;
        add_metrics(w, row);
        n_stats += add_stats(w, idx, n_idx, step);
        if (fp8t_tb_write_step(w, step, err, sizeof(err)) != 0) goto fail;
        rows++;
    }
    printf("%s: %d steps, %d statistics -> %s\n", run, rows, n_stats, fp8t_tb_path(w));
    printf("view: tensorboard --logdir %s\n", dir);
    rc = 0;
fail:
    if (w) {
        char path[1300];
        snprintf(path, sizeof(path), "%s", fp8t_tb_path(w));
        if (fp8t_tb_close(w, rc == 0 ? err : NULL, rc == 0 ? sizeof(err) : 0) != 0) rc = 2;
        if (rc != 0) remove(path); /* ours, and half written */
    }
    if (rc != 0) fprintf(stderr, "fp8train " CMD ": %s\n", err);
    free(idx);
    cJSON_Delete(metrics);
    cJSON_Delete(stats);
    return rc;
}
