/* The subcommands' command lines, parsed by their option tables (see cli_args.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/error.h"
#include "cli/cli_args.h"

int cli_parse(const fp8t_opt_spec *s, void *obj, size_t size, int argc, char **argv,
              const char **pos, int *n_pos) {
    /* the defaults, for --help after options that changed them ("--rows 5 --help") */
    void *defaults = malloc(size);
    char err[FP8T_ERR_LEN];
    if (!defaults) {
        fprintf(stderr, "fp8train %s: out of memory\n", s->cmd);
        return 2;
    }
    memcpy(defaults, obj, size);
    int rc = fp8t_opt_parse(s, obj, argc, argv, pos, n_pos, err, sizeof(err)), status = -1;
    if (rc == FP8T_OPT_HELP) {
        fp8t_opt_help(stdout, s, defaults);
        status = 0;
    } else if (rc == FP8T_OPT_LIST) {
        fp8t_opt_list(stdout, s);
        status = 0;
    } else if (rc != 0) {
        fprintf(stderr, "fp8train %s: %s\n", s->cmd, err);
        status = 2;
    }
    free(defaults);
    return status;
}

int cli_set_u64_given(const char *name, const char *v, uint64_t *out, int *given, char *err,
                      size_t errlen) {
    /* a row of its own over *out alone, so the value and its message are the table's */
    const fp8t_opt row = {.name = name, .type = FP8T_OPT_U64, .off = 0, .size = sizeof(*out)};
    if (fp8t_opt_set(&row, out, v, err, errlen) != 0) return -1;
    *given = 1;
    return 0;
}
