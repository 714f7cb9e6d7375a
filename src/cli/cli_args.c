/* Option values of the subcommands (see cli_args.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli_args.h"

int cli_int(const char *cmd, const char *opt, const char *v, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "fp8train %s: %s needs an integer in %ld..%ld (got '%s')\n", cmd, opt, lo,
                hi, v ? v : "");
        return -1;
    }
    *out = (int)x;
    return 0;
}

int cli_u64(const char *cmd, const char *opt, const char *v, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long x = v ? strtoull(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || v[0] == '-') {
        fprintf(stderr, "fp8train %s: %s needs a non-negative integer (got '%s')\n", cmd, opt,
                v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

int cli_float(const char *cmd, const char *opt, const char *v, double lo, double hi, float *out) {
    char *end;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || errno || end == v || *end || !isfinite(x) || x < lo || x > hi) {
        fprintf(stderr, "fp8train %s: %s needs a number in [%g, %g] (got '%s')\n", cmd, opt, lo, hi,
                v ? v : "");
        return -1;
    }
    *out = (float)x;
    return 0;
}

const char *cli_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "fp8train %s: %s needs a value (see fp8train %s --help)\n", cmd, argv[*i],
                cmd);
        return NULL;
    }
    return argv[++*i];
}
