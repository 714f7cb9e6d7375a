/* Option values of the subcommands: one parser per kind of number, each printing what the
 * option needs when the value does not fit. */
#ifndef FP8TRAIN_CLI_ARGS_H
#define FP8TRAIN_CLI_ARGS_H

#include <stdint.h>

/* Parse an option's value; on failure print "fp8train CMD: OPT needs ..." and return -1. */
int cli_int(const char *cmd, const char *opt, const char *v, long lo, long hi, int *out);
int cli_u64(const char *cmd, const char *opt, const char *v, uint64_t *out);
int cli_float(const char *cmd, const char *opt, const char *v, double lo, double hi, float *out);
/* The value after option argv[*i] (advancing *i), or NULL with a message when it is missing. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);

#endif
