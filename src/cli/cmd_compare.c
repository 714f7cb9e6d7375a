/* `fp8train compare RUN_A RUN_B`: align two runs' losses, classify the gap, print it (or
 * JSON), optionally write the HTML report. Exit code for CI: 0 match, 1 mismatch, 2 bad input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_args.h"
#include "cli/cmd_compare.h"
#include "fp8train/compare.h"
#include "fp8train/error.h"

typedef struct {
    fp8t_compare_cfg cfg;
    const char *report, *labels, *noise;
    int json;
} compare_opts;

#define F(f) FP8T_OPT_FIELD(compare_opts, f)
static const fp8t_opt OPTS[] = {
    {.name = "report",
     .arg = "FILE",
     .type = FP8T_OPT_STR,
     F(report),
     .help = "write a self-contained HTML report (charts, tables)"},
    /* (0, 10) is checked after the parse, with an example of a sensible value */
    {.name = "threshold",
     .arg = "X",
     .type = FP8T_OPT_FLOAT,
     F(cfg.threshold),
     .lo = 0,
     .hi = 10,
     .help = "relative loss gap that counts as a mismatch"},
    {.name = "noise-run",
     .arg = "RUN",
     .type = FP8T_OPT_STR,
     F(noise),
     .dflt = "estimated from the runs' step-to-step spread",
     .help = "a second baseline (e.g. BF16 with another --seed): its gap to A measures the "
             "noise; an end gap inside it is a match"},
    {.name = "json",
     .type = FP8T_OPT_FLAG,
     F(json),
     .help = "print the result as one JSON object"},
    {.name = "window",
     .arg = "N",
     .type = FP8T_OPT_INT,
     F(cfg.window),
     .lo = 1,
     .hi = 1e9,
     .dflt = "n/10, 3..50",
     .help = "smoothing window of the gap in steps"},
    {.name = "spike-z",
     .arg = "Z",
     .type = FP8T_OPT_FLOAT,
     F(cfg.spike_z),
     .help = "robust z-score of a spike"},
    {.name = "spike-window",
     .arg = "N",
     .type = FP8T_OPT_INT,
     F(cfg.spike_window),
     .lo = 1,
     .hi = 1e9,
     .help = "samples in the spike detector's window"},
    {.name = "slow-recovery",
     .arg = "N",
     .type = FP8T_OPT_INT,
     F(cfg.slow_recovery),
     .lo = 1,
     .hi = 1e9,
     .dflt = "max(10, steps/10)",
     .help = "a spike recovering slower than N steps points at FP8"},
    {.name = "cosine-flag",
     .arg = "X",
     .type = FP8T_OPT_FLOAT,
     F(cfg.cosine_flag),
     .help = "flag dumped tensors with cosine below X"},
    {.name = "labels",
     .arg = "A,B",
     .type = FP8T_OPT_STR,
     F(labels),
     .dflt = "directory names",
     .help = "names of the runs in output"},
};
#undef F

static const fp8t_opt_spec SPEC = {
    .cmd = "compare",
    .usage = "RUN_A RUN_B [--noise-run RUN_C] [options]",
    .about = "Compare run B (e.g. FP8) against baseline A (e.g. BF16). A RUN is a run directory\n"
             "(fp8train train --out DIR) or the path of its metrics.jsonl.\n",
    .epilog =
        "exit code: 0 match, 1 mismatch (spike, drift, early-divergence, nan), 2 bad input\n",
    .opts = OPTS,
    .n_opts = (int)(sizeof(OPTS) / sizeof(OPTS[0])),
    .max_pos = 2,
    .wrap = CLI_HELP_WRAP,
};

int fp8t_cmd_compare(int argc, char **argv) {
    if (argc > 0 && strcmp(argv[0], "compare") == 0) {
        argc--;
        argv++;
    }
    compare_opts o = {.report = NULL, .labels = NULL, .noise = NULL, .json = 0};
    fp8t_compare_cfg_default(&o.cfg);
    const char *runs[2] = {NULL, NULL};
    int nruns = 0, st = cli_parse(&SPEC, &o, sizeof(o), argc, argv, runs, &nruns);
    if (st >= 0) return st;
    fp8t_compare_cfg cfg = o.cfg;
    const char *report = o.report, *labels = o.labels, *noise = o.noise;
    const int json = o.json;
    if (nruns != 2) {
        fprintf(stderr, "fp8train compare: need two runs, got %d\n", nruns);
        fp8t_opt_help(stderr, &SPEC, &o);
        return 2;
    }
    if (!(cfg.threshold > 0 && cfg.threshold < 10)) {
        fprintf(stderr,
                "fp8train compare: --threshold %g: expected a relative gap in (0, 10), "
                "e.g. 0.01 for 1%%\n",
                cfg.threshold);
        return 2;
    }
    fp8t_run ra, rb;
    char err[FP8T_ERR_LEN];
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
            if (s) {
                puts(s);
                free(s);
            }
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
