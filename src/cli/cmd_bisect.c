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
#include "fp8train/error.h"
#include "fp8train/inject.h"
#include "fp8train/train_options.h"
#include "cli/cli_args.h"
#include "cli/cmd_bisect.h"

/* bisect's own options; every other argument is a train option, handed to train's parser.
 * --steps and --out are train's too (the length of each experiment, the bisect's directory):
 * listed here, and handed on as given. */
typedef struct {
    double threshold, tail;
    const char *steps, *out;
    int help_inject;
} bisect_opts;

/* A number in (0, 1) or, with one_ok, (0, 1]. */
static int parse_fraction(const char *opt, const char *v, int one_ok, const char *example,
                          double *out, char *err, size_t errlen) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x > 0 && (x < 1 || (one_ok && x == 1)))) {
        return fp8t_errorf(err, errlen,
                           "%s: bad value '%s' (expected a number in (0, 1%s, e.g. %s)", opt, v,
                           one_ok ? "]" : ")", example);
    }
    *out = x;
    return 0;
}
static int set_threshold(void *obj, const char *v, char *err, size_t errlen) {
    return parse_fraction("--threshold", v, 0, "0.01", &((bisect_opts *)obj)->threshold, err,
                          errlen);
}
static void get_threshold(const void *obj, char *b, size_t n) {
    snprintf(b, n, "%g", ((const bisect_opts *)obj)->threshold);
}
static int set_tail(void *obj, const char *v, char *err, size_t errlen) {
    return parse_fraction("--tail", v, 1, "0.1", &((bisect_opts *)obj)->tail, err, errlen);
}
static void get_tail(const void *obj, char *b, size_t n) {
    snprintf(b, n, "%g", ((const bisect_opts *)obj)->tail);
}

#define G "bisect options"
#define F(f) FP8T_OPT_FIELD(bisect_opts, f)
static const fp8t_opt OPTS[] = {
    {.name = "steps",
     .arg = "N",
     .group = G,
     .type = FP8T_OPT_STR,
     F(steps),
     .dflt = FP8T_OPT_NO_DEFAULT,
     .help = "steps of every experiment, from the start point (required; with --resume: N "
             "steps after the checkpoint)"},
    {.name = "threshold",
     .arg = "X",
     .group = G,
     .type = FP8T_OPT_SPECIAL,
     .set = set_threshold,
     .get = get_threshold,
     .help = "relative loss gap under which two runs match"},
    {.name = "tail",
     .arg = "F",
     .group = G,
     .type = FP8T_OPT_SPECIAL,
     .set = set_tail,
     .get = get_tail,
     .help = "fraction of the last steps whose mean loss is compared"},
    {.name = "out",
     .arg = "DIR",
     .group = G,
     .type = FP8T_OPT_STR,
     F(out),
     .dflt = "runs/bisect",
     .help = "the bisect's own directory; a directory that holds anything but a previous "
             "bisect is refused"},
    {.name = "help-inject",
     .group = G,
     .type = FP8T_OPT_FLAG,
     F(help_inject),
     .dflt = FP8T_OPT_NO_DEFAULT,
     .help = "the --inject fault syntax (to try bisect on a known fault)"},
};
#undef F
#undef G

static const fp8t_opt_spec SPEC = {
    .cmd = "bisect",
    .usage = "[train options] --steps N [--threshold 0.01] [--tail 0.1]\n"
             "                       [--out DIR] [--resume CKPT] [--inject SPEC]",
    .about =
        "Finds which FP8 GEMM makes a run drift from BF16, and the cheapest policy override\n"
        "that fixes it, with short runs from one start and one data order (each into\n"
        "OUT/<name>/): a BF16 baseline; FP8 as configured (stops here when it\n"
        "already matches); the recovery experiment (the FP8 checkpoint of the midpoint\n"
        "continued in BF16); every GEMM fake-quantized; Fprop, Dgrad, Wgrad back in BF16 one\n"
        "at a time; a binary search over layer ranges for the culprit; current scaling for\n"
        "the culprit. Prints the evidence table and a ready-to-paste --override; writes\n"
        "OUT/bisect.json and OUT/report.html.\n",
    .epilog =
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
        "train options (see fp8train train --help):\n",
    .opts = OPTS,
    .n_opts = (int)(sizeof(OPTS) / sizeof(OPTS[0])),
    .max_pos = -1,
    .pass_unknown = 1,
    .wrap = CLI_HELP_WRAP,
};

/* bisect's help, then train's (whose options bisect takes) */
static void usage(FILE *f, const fp8t_bisect_config *bc) {
    bisect_opts d = {.threshold = bc->threshold, .tail = bc->tail_frac};
    fp8t_opt_help(f, &SPEC, &d);
    fp8t_train_options_help(f);
}

int fp8t_cmd_bisect(int argc, char **argv) {
    fp8t_bisect_config *bc = malloc(sizeof *bc);
    char **rest = malloc(((size_t)argc + 5) * sizeof *rest); /* + --steps N --out DIR */
    if (!bc || !rest) {
        fprintf(stderr, "fp8train bisect: out of memory\n");
        free(bc), free(rest);
        return 2;
    }
    fp8t_bisect_config_default(bc);
    if (argc > 0 && !strcmp(argv[0], "bisect")) argc--, argv++;
    bisect_opts o = {.threshold = bc->threshold, .tail = bc->tail_frac};
    int n_rest = 0, rc = 2;
    char err[FP8T_ERR_LEN];
    int prc =
        fp8t_opt_parse(&SPEC, &o, argc, argv, (const char **)rest, &n_rest, err, sizeof err);
    if (prc == FP8T_OPT_HELP || prc == FP8T_OPT_LIST || o.help_inject) {
        if (prc == FP8T_OPT_HELP)
            usage(stdout, bc);
        else if (prc == FP8T_OPT_LIST)
            fp8t_opt_list(stdout, &SPEC);
        else
            fputs(fp8t_injector_help(), stdout);
        rc = 0;
        goto out;
    }
    if (prc != 0) {
        fprintf(stderr, "fp8train bisect: %s\n", err);
        goto out;
    }
    if (!o.steps) {
        fprintf(stderr, "fp8train bisect: --steps N is required: the length of every "
                        "experiment (e.g. --steps 100; a bisect runs about a dozen of them)\n");
        goto out;
    }
    bc->threshold = o.threshold;
    bc->tail_frac = o.tail;
    /* --steps and --out are train's options too: train checks them and sets them up */
    rest[n_rest++] = "--steps";
    rest[n_rest++] = (char *)o.steps;
    if (o.out) {
        rest[n_rest++] = "--out";
        rest[n_rest++] = (char *)o.out;
    }
    rest[n_rest] = NULL;
    /* (--help and --list-options never reach train: bisect's parse answered them) */
    prc = fp8t_train_parse_args(&bc->train, n_rest, rest, err, sizeof err);
    if (prc != 0) {
        fprintf(stderr, "fp8train bisect: %s\n", err);
        goto out;
    }
    bc->steps = bc->train.steps;
    snprintf(bc->out_dir, sizeof bc->out_dir, "%s", o.out ? bc->train.out_dir : "runs/bisect");
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
