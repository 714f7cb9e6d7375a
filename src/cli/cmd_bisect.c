/* `fp8train bisect [train options] --steps N [--threshold 0.01] [--tail 0.1] [--out DIR]`:
 * the FP8 debugging procedure, automated (include/fp8train/bisect.h). The train options pick
 * the model, data, seed, FP8 policy, --inject and --resume of the run under investigation;
 * --steps is the length of every experiment, counted from the start point.
 * Exit: 0 conclusion reached (a fix, or no FP8 problem), 1 no override closes the gap,
 * 2 bad input or a failed experiment. A result too noisy to trust (an experiment ends further
 * below the BF16 baseline than the threshold) keeps these statuses: it is printed with a
 * WARNING and an UNCONFIRMED culprit, and bisect.json says "reliable": false.
 * Under mpirun (-np N) every rank runs the same experiments as N-rank data-parallel runs;
 * rank 0 prints and writes bisect.json and report.html. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/bisect.h"
#include "fp8train/dist.h"
#include "fp8train/inject.h"
#include "fp8train/train_options.h"
#include "cli/cmd_bisect.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: fp8train bisect [train options] --steps N [--threshold 0.01] [--tail 0.1]\n"
            "                       [--out DIR] [--resume CKPT] [--inject SPEC]\n"
            "\n"
            "Finds which FP8 GEMM makes a run drift from BF16, and the cheapest policy override\n"
            "that fixes it, with short runs from one start and one data order (each into\n"
            "OUT/<name>/): a BF16 baseline; FP8 as configured (stops here when it\n"
            "already matches); the recovery experiment (the FP8 checkpoint of the midpoint\n"
            "continued in BF16); every GEMM fake-quantized; Fprop, Dgrad, Wgrad back in BF16 one\n"
            "at a time; a binary search over layer ranges for the culprit; current scaling for\n"
            "the culprit. Prints the evidence table and a ready-to-paste --override; writes\n"
            "OUT/bisect.json and OUT/report.html.\n"
            "\n"
            "bisect options:\n"
            "  --steps N          steps of every experiment, from the start point (required;\n"
            "                     with --resume: N steps after the checkpoint)\n"
            "  --threshold X      relative loss gap under which two runs match (default 0.01)\n"
            "  --tail F           fraction of the last steps whose mean loss is compared\n"
            "                     (default 0.1)\n"
            "  --out DIR          the bisect's own directory (default runs/bisect); a directory\n"
            "                     that holds anything but a previous bisect is refused\n"
            "  --help-inject      the --inject fault syntax (to try bisect on a known fault)\n"
            "\n"
            "Noise: every experiment only adds FP8 rounding to the BF16 baseline, so one that ends\n"
            "BELOW it measures how far runs differing only by rounding spread. When that exceeds\n"
            "--threshold the result is unreliable: a WARNING opens the summary, the culprit and\n"
            "fix are labelled UNCONFIRMED, and bisect.json has \"reliable\": false (with \"noise\"\n"
            "and \"noise_experiment\"). Calm the setup (lower --lr, longer --warmup, --resume past\n"
            "the unstable phase), add --steps, or raise --threshold to 2x the noise.\n"
            "\n"
            "exit status: 0 conclusion reached (a fix, or no FP8 problem), 1 no override\n"
            "closes the gap, 2 bad input; the same whether reliable or not (check \"reliable\"\n"
            "in bisect.json before acting on the override from a script)\n"
            "\n"
            "train options (see fp8train train --help):\n");
}

/* Value of --name X or --name=X at argv[*i]; advances *i past a separate value. NULL if the
 * argument is not --name. *missing is set when --name has no value. */
static const char *take_value(int argc, char **argv, int *i, const char *name, int *missing) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n] != 0) return NULL;
    if (*i + 1 >= argc || strncmp(argv[*i + 1], "--", 2) == 0) {
        *missing = 1; /* "--threshold --out DIR": the value was forgotten */
        return NULL;
    }
    return argv[++*i];
}

/* A number in (0, 1) or, with one_ok, (0, 1]. */
static int parse_fraction(const char *opt, const char *v, int one_ok, const char *example,
                          double *out) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x > 0 && (x < 1 || (one_ok && x == 1)))) {
        fprintf(stderr, "fp8train bisect: %s: bad value '%s' (expected a number in (0, 1%s, "
                        "e.g. %s)\n",
                opt, v, one_ok ? "]" : ")", example);
        return -1;
    }
    *out = x;
    return 0;
}

int fp8t_cmd_bisect(int argc, char **argv) {
    fp8t_bisect_config *bc = malloc(sizeof *bc);
    char **rest = malloc(((size_t)argc + 1) * sizeof *rest);
    if (!bc || !rest) {
        fprintf(stderr, "fp8train bisect: out of memory\n");
        free(bc), free(rest);
        return 2;
    }
    fp8t_bisect_config_default(bc);
    if (argc > 0 && !strcmp(argv[0], "bisect")) argc--, argv++;
    int n_rest = 0, have_steps = 0, have_out = 0, rc = 2;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v;
        int missing = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            fp8t_train_options_help(stdout);
            rc = 0;
            goto out;
        }
        if (!strcmp(a, "--help-inject")) {
            fputs(fp8t_injector_help(), stdout);
            rc = 0;
            goto out;
        }
        if ((v = take_value(argc, argv, &i, "--threshold", &missing))) {
            if (parse_fraction("--threshold", v, 0, "0.01", &bc->threshold) != 0) goto out;
            continue;
        }
        if ((v = take_value(argc, argv, &i, "--tail", &missing))) {
            if (parse_fraction("--tail", v, 1, "0.1", &bc->tail_frac) != 0) goto out;
            continue;
        }
        if (missing) {
            fprintf(stderr, "fp8train bisect: %s needs a value\n", a);
            goto out;
        }
        if (!strncmp(a, "--steps", 7) && (a[7] == 0 || a[7] == '=')) have_steps = 1;
        if (!strncmp(a, "--out", 5) && (a[5] == 0 || a[5] == '=')) have_out = 1;
        rest[n_rest++] = argv[i];
    }
    rest[n_rest] = NULL;
    if (!have_steps) {
        fprintf(stderr, "fp8train bisect: --steps N is required: the length of every "
                        "experiment (e.g. --steps 100; a bisect runs about a dozen of them)\n");
        goto out;
    }
    char err[1024];
    int prc = fp8t_train_parse_args(&bc->train, n_rest, rest, err, sizeof err);
    if (prc == 1) {
        usage(stdout);
        fp8t_train_options_help(stdout);
        rc = 0;
        goto out;
    }
    if (prc != 0) {
        fprintf(stderr, "fp8train bisect: %s\n", err);
        goto out;
    }
    bc->steps = bc->train.steps;
    snprintf(bc->out_dir, sizeof bc->out_dir, "%s", have_out ? bc->train.out_dir : "runs/bisect");
    /* under mpirun every rank runs the experiments (data parallel, the same N); rank 0 speaks
     * and writes the report */
    if (fp8t_dist_init(err, sizeof err) != 0) {
        fprintf(stderr, "fp8train bisect: %s\n", err);
        goto out;
    }
    const int rank = fp8t_dist_rank();
    bc->log = rank == 0 ? stdout : NULL;
    fp8t_bisect_result *res = malloc(sizeof *res);
    if (!res) {
        fprintf(stderr, "fp8train bisect: out of memory\n");
        fp8t_dist_abort(2); /* the other ranks would wait for this one in the first run */
    }
    if (fp8t_bisect_run(bc, res, err, sizeof err) != 0) {
        if (rank == 0) fprintf(stderr, "fp8train bisect: %s\n", err);
        rc = 2;
    } else {
        rc = fp8t_bisect_exit_code(res);
    }
    free(res);
out:
    free(rest);
    free(bc);
    return rc;
}
