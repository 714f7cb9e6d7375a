/* `fp8train compare RUN_A RUN_B`: align two runs' losses, classify the gap, print it (or
 * JSON), optionally write the HTML report. Exit code for CI: 0 match, 1 mismatch, 2 bad input. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd_compare.h"
#include "fp8train/compare.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: fp8train compare RUN_A RUN_B [--noise-run RUN_C] [options]\n"
            "  Compare run B (e.g. FP8) against baseline A (e.g. BF16). A RUN is a run directory\n"
            "  (fp8train train --out DIR) or the path of its metrics.jsonl.\n"
            "options:\n"
            "  --report FILE        write a self-contained HTML report (charts, tables)\n"
            "  --threshold X        relative loss gap that counts as a mismatch (default 0.01)\n"
            "  --noise-run RUN      a second baseline (e.g. BF16 with another --seed): its gap to\n"
            "                       A measures the noise; an end gap inside it is a match\n"
            "                       (default: estimated from the runs' step-to-step spread)\n"
            "  --json               print the result as one JSON object\n"
            "  --window N           smoothing window of the gap in steps (default: n/10, 3..50)\n"
            "  --spike-z Z          robust z-score of a spike (default 6)\n"
            "  --spike-window N     samples in the spike detector's window (default 50)\n"
            "  --slow-recovery N    a spike recovering slower than N steps points at FP8\n"
            "                       (default: max(10, steps/10))\n"
            "  --cosine-flag X      flag dumped tensors with cosine below X (default 0.99)\n"
            "  --labels A,B         names of the runs in output (default: directory names)\n"
            "exit code: 0 match, 1 mismatch (spike, drift, early-divergence, nan), 2 bad input\n");
}

static int parse_double(double *out, const char *opt, const char *v) {
    char *end;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || errno || end == v || *end || !isfinite(x)) {
        fprintf(stderr, "fp8train compare: %s needs a number (got '%s')\n", opt, v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_int(int *out, const char *opt, const char *v) {
    double x;
    if (parse_double(&x, opt, v)) return -1;
    if (x < 1 || x > 1e9 || x != floor(x)) {
        fprintf(stderr, "fp8train compare: %s needs a positive integer (got '%s')\n", opt, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int fp8t_cmd_compare(int argc, char **argv) {
    if (argc > 0 && strcmp(argv[0], "compare") == 0) { argc--; argv++; }
    fp8t_compare_cfg cfg;
    fp8t_compare_cfg_default(&cfg);
    const char *runs[2] = {NULL, NULL}, *report = NULL, *labels = NULL, *noise = NULL;
    int json = 0, nruns = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) { usage(stdout); return 0; }
        else if (strcmp(a, "--json") == 0) json = 1;
        else if (strcmp(a, "--report") == 0) { report = v; i++; if (!v) rc = -1; }
        else if (strcmp(a, "--labels") == 0) { labels = v; i++; if (!v) rc = -1; }
        else if (strcmp(a, "--noise-run") == 0) { noise = v; i++; if (!v) rc = -1; }
        else if (strcmp(a, "--threshold") == 0) { rc = parse_double(&cfg.threshold, a, v); i++; }
        else if (strcmp(a, "--window") == 0) { rc = parse_int(&cfg.window, a, v); i++; }
        else if (strcmp(a, "--spike-z") == 0) { rc = parse_double(&cfg.spike_z, a, v); i++; }
        else if (strcmp(a, "--spike-window") == 0) { rc = parse_int(&cfg.spike_window, a, v); i++; }
        else if (strcmp(a, "--slow-recovery") == 0) { rc = parse_int(&cfg.slow_recovery, a, v); i++; }
        else if (strcmp(a, "--cosine-flag") == 0) { rc = parse_double(&cfg.cosine_flag, a, v); i++; }
        else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "fp8train compare: unknown option '%s' (see fp8train compare --help)\n", a);
            return 2;
        } else if (nruns < 2) runs[nruns++] = a;
        else {
            fprintf(stderr, "fp8train compare: too many runs ('%s'); compare takes RUN_A RUN_B\n", a);
            return 2;
        }
        if (rc) {
            if (!v) fprintf(stderr, "fp8train compare: %s needs a value\n", a);
            return 2;
        }
    }
    if (nruns != 2) {
        fprintf(stderr, "fp8train compare: need two runs, got %d\n", nruns);
        usage(stderr);
        return 2;
    }
    if (!(cfg.threshold > 0 && cfg.threshold < 10)) {
        fprintf(stderr, "fp8train compare: --threshold %g: expected a relative gap in (0, 10), "
                        "e.g. 0.01 for 1%%\n", cfg.threshold);
        return 2;
    }
    fp8t_run ra, rb;
    char err[1024];
    if (fp8t_run_load(&ra, runs[0], err, sizeof(err))) {
        fprintf(stderr, "fp8train compare: run A: %s\n", err);
        return 2;
    }
    if (fp8t_run_load(&rb, runs[1], err, sizeof(err))) {
        fprintf(stderr, "fp8train compare: run B: %s\n", err);
        fp8t_run_free(&ra);
        return 2;
    }
    fp8t_run rn;
    int have_noise = 0;
    if (noise) {
        if (fp8t_run_load(&rn, noise, err, sizeof(err))) {
            fprintf(stderr, "fp8train compare: --noise-run: %s\n", err);
            fp8t_run_free(&ra);
            fp8t_run_free(&rb);
            return 2;
        }
        have_noise = 1;
        cfg.noise_run = &rn;
    }
    if (labels) {
        const char *comma = strchr(labels, ',');
        if (!comma) {
            fprintf(stderr, "fp8train compare: --labels needs two names: A,B\n");
            fp8t_run_free(&ra);
            fp8t_run_free(&rb);
            if (have_noise) fp8t_run_free(&rn);
            return 2;
        }
        snprintf(ra.label, sizeof(ra.label), "%.*s", (int)(comma - labels), labels);
        snprintf(rb.label, sizeof(rb.label), "%s", comma + 1);
    }
    fp8t_compare_result res;
    int code;
    if (fp8t_compare_runs(&res, &ra, &rb, &cfg, err, sizeof(err))) {
        fprintf(stderr, "fp8train compare: %s\n", err);
        code = 2;
    } else {
        code = fp8t_compare_exit_code(&res);
        if (json) {
            char *s = fp8t_compare_to_json(&ra, &rb, &res);
            if (s) { puts(s); free(s); }
        } else {
            fp8t_compare_print(stdout, &ra, &rb, &res);
        }
        if (report) {
            if (fp8t_report_html_write(report, &ra, &rb, &res, err, sizeof(err))) {
                fprintf(stderr, "fp8train compare: --report: %s\n", err);
                code = 2;
            } else {
                fprintf(json ? stderr : stdout, "report: %s\n", report);
            }
        }
        fp8t_compare_result_free(&res);
    }
    fp8t_run_free(&ra);
    fp8t_run_free(&rb);
    if (have_noise) fp8t_run_free(&rn);
    fflush(stdout);
    return code;
}
