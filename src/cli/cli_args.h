/* Option values of the subcommands: the command line parsed by a command's option table
 * (util/opt_table.h), with the messages and exit statuses every subcommand shares. */
#ifndef FP8TRAIN_CLI_ARGS_H
#define FP8TRAIN_CLI_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "util/opt_table.h"

/* the column at which the subcommands' generated --help wraps its lines */
#define CLI_HELP_WRAP 92

/* Parse argv by the command's table into obj (`size` bytes, holding the command's defaults),
 * the positional arguments into pos (room for s->max_pos of them, or argc when that is -1)
 * and their count into *n_pos. Returns -1 to go on, else the exit status to return at once:
 * 0 after printing --help (the defaults as obj held them before the parse) or --list-options
 * to stdout, 2 after printing the error as "fp8train CMD: ..." to stderr. */
int cli_parse(const fp8t_opt_spec *s, void *obj, size_t size, int argc, char **argv,
              const char **pos, int *n_pos);

/* A SPECIAL row's setter for a u64 option whose default depends on the weights (a checkpoint's
 * seed, its data position), so the command must know whether it was given: v parsed as a U64
 * row parses it ("--NAME: bad value ..." into err), then *given = 1. 0 ok, -1 bad value. */
int cli_set_u64_given(const char *name, const char *v, uint64_t *out, int *given, char *err,
                      size_t errlen);

#endif
