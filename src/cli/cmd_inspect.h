/* `fp8train inspect`: the subcommand's entry point for the CLI dispatch table. */
#ifndef FP8TRAIN_CMD_INSPECT_H
#define FP8TRAIN_CMD_INSPECT_H

/* argv[0] is the first argument after "inspect" (a leading "inspect" is skipped too). Returns
 * the process exit code: 0 nothing flagged, 1 a tensor flagged (cosine < the flag, non-finite
 * values, or a dump far from BF16 with --compare-bf16), 2 bad input or usage. */
int fp8t_cmd_inspect(int argc, char **argv);

#endif
