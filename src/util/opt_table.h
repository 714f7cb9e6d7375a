/* fp8train — option tables: one row per command-line option of a command (its spelling,
 * metavariable, help, group, type, place in the command's options struct, range), from which
 * the command line is parsed and the --help text generated, so the two cannot drift apart.
 * `train` adds its --config JSON and config.json on top of the same rows (src/train/options.c);
 * the other subcommands (src/cli/) use the rows alone. Private to the library (src/). */
#ifndef FP8TRAIN_UTIL_OPT_TABLE_H
#define FP8TRAIN_UTIL_OPT_TABLE_H

#include <stddef.h>
#include <stdio.h>

typedef enum {
    FP8T_OPT_INT,     /* int, range [lo, hi] */
    FP8T_OPT_FLOAT,   /* float or double (by the field's size); range [lo, hi] when hi > lo,
                         else any finite number */
    FP8T_OPT_U64,     /* uint64_t; range [lo, hi] when hi > lo, else any */
    FP8T_OPT_STR,     /* const char *: points at the argument itself (argv outlives the parse) */
    FP8T_OPT_STRBUF,  /* char[size], copied */
    FP8T_OPT_FLAG,    /* int set to 1 by --name alone (--name=0 clears it) */
    FP8T_OPT_BOOL,    /* int from 0|1 (also true/false, yes/no, on/off) */
    FP8T_OPT_CHOICE,  /* int (or an enum) from one of the row's choices */
    FP8T_OPT_SPECIAL, /* the row's own setter and getter */
} fp8t_opt_type;

typedef struct {
    const char *name;
    int value;
} fp8t_opt_choice;

/* A special row's value: 0 ok; -1 with err ("--name: bad value ..."). obj is the whole
 * options struct, so one option may set several fields. */
typedef int (*fp8t_opt_setter)(void *obj, const char *v, char *err, size_t errlen);
/* A special row's current value as text (the help's default, train's config.json). */
typedef void (*fp8t_opt_getter)(const void *obj, char *buf, size_t len);

/* dflt of a row whose help shows no "(default ...)" (a required option, an action) */
#define FP8T_OPT_NO_DEFAULT ""

typedef struct {
    const char *name; /* command-line spelling without "--" */
    const char *arg;  /* metavariable; NULL for FLAG rows */
    const char *help;
    const char *group; /* the help's heading; NULL: "Options" */
    fp8t_opt_type type;
    size_t off, size;               /* field offset in the options struct, and its size */
    double lo, hi;                  /* inclusive range of numeric values */
    fp8t_opt_setter set;            /* SPECIAL (NULL: the owner handles the row itself) */
    fp8t_opt_getter get;            /* SPECIAL (NULL: no value to show) */
    const fp8t_opt_choice *choices; /* CHOICE: ended by a {NULL, 0} entry */
    const char *dflt; /* NULL: the default read from the struct; else this text, or nothing
                          for FP8T_OPT_NO_DEFAULT ("" read from a struct shows as "none") */
    unsigned user;    /* bits for the table's owner (train: written inside "model") */
} fp8t_opt;

/* the offset and size of member f of struct type T, for a row */
#define FP8T_OPT_FIELD(T, f) offsetof(T, f), sizeof(((T *)0)->f)

/* A command: its table and the text around it in --help. */
typedef struct {
    const char *cmd;    /* "import": messages start "fp8train import: ", help "usage: ..." */
    const char *usage;  /* the usage line after "fp8train CMD " (may hold "\n" + more lines) */
    const char *about;  /* text between the usage line and the options; NULL: none */
    const char *epilog; /* text after the options (examples, exit status); NULL: none */
    const fp8t_opt *opts;
    int n_opts;
    int max_pos;      /* positional arguments accepted: 0 none, -1 any number */
    int pass_unknown; /* unknown options and extra arguments are handed back in order, as
                           positionals (bisect hands them to train) */
    int wrap;         /* the help's lines are wrapped at this column; 0: one line per row */
} fp8t_opt_spec;

/* the row named `name` (without "--"), or NULL */
const fp8t_opt *fp8t_opt_find(const fp8t_opt *t, int n, const char *name);

/* Set row o of obj from the text v: 0 ok; -1 with err "--name: bad value 'v' (expected ...)". */
int fp8t_opt_set(const fp8t_opt *o, void *obj, const char *v, char *err, size_t errlen);
/* Row o's value in obj as text ("" for an unset string). */
void fp8t_opt_get(const fp8t_opt *o, const void *obj, char *buf, size_t len);

/* One step over argv, from argv[*i] (advanced past what it took): */
typedef enum {
    FP8T_OPT_END,        /* no argument left */
    FP8T_OPT_OPTION,     /* an option of the table: *row, *value (NULL for a flag alone) */
    FP8T_OPT_POSITIONAL, /* *value: a positional argument (or, with pass_unknown, anything the
                            table does not know) */
    FP8T_OPT_HELP,       /* -h or --help */
    FP8T_OPT_LIST,       /* --list-options: the option names (shell completion, tests) */
    FP8T_OPT_ERROR,      /* err: an unknown option, or one missing its value */
} fp8t_opt_step;
fp8t_opt_step fp8t_opt_next(const fp8t_opt_spec *s, int argc, char **argv, int *i,
                            const fp8t_opt **row, const char **value, char *err, size_t errlen);

/* Parse argv into obj (which holds its defaults already), the positional arguments into pos
 * (room for argc entries; NULL when the command takes none) and their count into *n_pos.
 * Returns 0 ok, FP8T_OPT_HELP or FP8T_OPT_LIST when asked for them (nothing else is checked
 * then), -1 with err (without the "fp8train CMD: " prefix). */
int fp8t_opt_parse(const fp8t_opt_spec *s, void *obj, int argc, char **argv, const char **pos,
                   int *n_pos, char *err, size_t errlen);

/* The generated help: usage line, about, the rows by group, each with its metavariable, help
 * and default (read from `defaults`, a struct holding the command's defaults), then the
 * epilog. */
void fp8t_opt_help(FILE *f, const fp8t_opt_spec *s, const void *defaults);
/* --list-options: "--name" (and " ARG") of every row, one a line. */
void fp8t_opt_list(FILE *f, const fp8t_opt_spec *s);

#endif
