/* `fp8train compare`: the subcommand's entry point for the CLI dispatch table. */
#ifndef FP8TRAIN_CMD_COMPARE_H
#define FP8TRAIN_CMD_COMPARE_H

/* argv[0] is the first argument after "compare" (a leading "compare" is skipped too).
 * Returns the process exit code: 0 match, 1 mismatch (spike, drift, early divergence, NaN),
 * 2 bad input or usage. */
int fp8t_cmd_compare(int argc, char **argv);

#endif
