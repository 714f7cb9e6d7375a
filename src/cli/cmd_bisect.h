/* `fp8train bisect`: the subcommand's entry point for the CLI dispatch table. */
#ifndef FP8TRAIN_CMD_BISECT_H
#define FP8TRAIN_CMD_BISECT_H

/* argv[0] is the first argument after "bisect". Returns the process exit code: 0 conclusion
 * reached (a fix, or no FP8 problem), 1 no override closes the gap, 2 bad input. */
int fp8t_cmd_bisect(int argc, char **argv);

#endif
