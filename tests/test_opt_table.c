/* The option-table engine (src/util/opt_table.c): every type parses and range-checks, unknown
 * options and missing values are refused naming the option, flags, positionals, the generated
 * help; and every subcommand converted to a table lists each of its options in its --help
 * (asked of the built fp8train: $FP8TRAIN_BIN, else the fp8train beside this test's
 * directory). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "util/opt_table.h"

/* the subcommands whose options come from a table */
static const char *const CONVERTED[] = {
    "train",    "import",   "tensorboard", "curves",  "compare",     "bisect", "export",
    "tokenize", "generate", "eval",        "inspect", "bench-infer", NULL};

typedef struct {
    int n;
    float x;
    double d;
    uint64_t seed, big;
    const char *name;
    char buf[8];
    int flag, on, kind, twice;
    const char *req;
} opts;

static int set_twice(void *obj, const char *v, char *err, size_t errlen) {
    opts *o = obj;
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end) {
        snprintf(err, errlen, "--twice: bad value '%s' (expected an integer)", v);
        return -1;
    }
    o->twice = (int)(2 * x);
    return 0;
}
static void get_twice(const void *obj, char *buf, size_t len) {
    snprintf(buf, len, "%d/2", ((const opts *)obj)->twice);
}

static const fp8t_opt_choice KINDS[] = {{"alpha", 1}, {"beta", 2}, {"gamma", 7}, {NULL, 0}};

#define F(f) FP8T_OPT_FIELD(opts, f)
static const fp8t_opt ROWS[] = {
    {.name = "n",
     .arg = "N",
     .help = "a count",
     .group = "Numbers",
     .type = FP8T_OPT_INT,
     F(n),
     .lo = 0,
     .hi = 10},
    {.name = "x",
     .arg = "X",
     .help = "a float",
     .group = "Numbers",
     .type = FP8T_OPT_FLOAT,
     F(x),
     .lo = 0,
     .hi = 1},
    {.name = "d",
     .arg = "D",
     .help = "a double",
     .group = "Numbers",
     .type = FP8T_OPT_FLOAT,
     F(d),
     .lo = -5,
     .hi = 5},
    {.name = "seed",
     .arg = "S",
     .help = "any u64",
     .group = "Numbers",
     .type = FP8T_OPT_U64,
     F(seed)},
    {.name = "big",
     .arg = "B",
     .help = "a ranged u64",
     .group = "Numbers",
     .type = FP8T_OPT_U64,
     F(big),
     .lo = 1,
     .hi = 1000},
    {.name = "name",
     .arg = "NAME",
     .help = "a borrowed string",
     .group = "Text",
     .type = FP8T_OPT_STR,
     F(name)},
    {.name = "buf",
     .arg = "S",
     .help = "a copied string",
     .group = "Text",
     .type = FP8T_OPT_STRBUF,
     F(buf)},
    {.name = "req",
     .arg = "R",
     .help = "required, no default shown",
     .group = "Text",
     .type = FP8T_OPT_STR,
     F(req),
     .dflt = FP8T_OPT_NO_DEFAULT},
    {.name = "flag", .help = "a flag", .type = FP8T_OPT_FLAG, F(flag)},
    {.name = "on", .arg = "0|1", .help = "a switch", .type = FP8T_OPT_BOOL, F(on)},
    {.name = "kind",
     .arg = "K",
     .help = "one of three",
     .type = FP8T_OPT_CHOICE,
     F(kind),
     .choices = KINDS},
    {.name = "twice",
     .arg = "T",
     .help = "stored doubled",
     .type = FP8T_OPT_SPECIAL,
     .set = set_twice,
     .get = get_twice,
     .dflt = NULL},
};
#undef F

static fp8t_opt_spec spec(int max_pos, int pass_unknown) {
    fp8t_opt_spec s = {.cmd = "demo",
                       .usage = "IN [options]",
                       .about = "Does nothing.\n",
                       .epilog = "example: fp8train demo in --n 3\n",
                       .opts = ROWS,
                       .n_opts = (int)(sizeof(ROWS) / sizeof(ROWS[0])),
                       .max_pos = max_pos,
                       .pass_unknown = pass_unknown,
                       .wrap = 60};
    return s;
}

static opts defaults(void) {
    opts o;
    memset(&o, 0, sizeof(o));
    o.n = 3, o.x = 0.5f, o.d = 1.25, o.seed = 1337, o.big = 10, o.kind = 2, o.twice = 8;
    snprintf(o.buf, sizeof(o.buf), "abc");
    return o;
}

/* parse a space-separated command line (no quoting: the tests need none) */
static int parse(const fp8t_opt_spec *s, opts *o, const char *line, const char **pos, int *np,
                 char *err, size_t errlen) {
    static char copy[1024];
    static char *argv[64];
    int argc = 0;
    snprintf(copy, sizeof(copy), "%s", line);
    for (char *t = strtok(copy, " "); t && argc < 63; t = strtok(NULL, " ")) argv[argc++] = t;
    argv[argc] = NULL;
    err[0] = 0;
    return fp8t_opt_parse(s, o, argc, argv, pos, np, err, errlen);
}

static void every_type_parses(void) {
    fp8t_opt_spec s = spec(2, 0);
    opts o = defaults();
    const char *pos[2] = {NULL, NULL};
    int np = -1;
    char err[512];
    int rc = parse(&s, &o,
                   "in --n 7 --x 0.25 --d=-4.5 --seed 18446744073709551615 --big 1000 --name "
                   "nm --buf 1234567 --req r --flag --on yes --kind gamma --twice 21 out",
                   pos, &np, err, sizeof(err));
    T_ASSERT(rc == 0, "rc %d: %s", rc, err);
    T_CHECK(o.n == 7 && o.x == 0.25f && o.d == -4.5, "n %d x %g d %g", o.n, (double)o.x, o.d);
    T_CHECK(o.seed == UINT64_MAX && o.big == 1000, "seed %llu big %llu",
            (unsigned long long)o.seed, (unsigned long long)o.big);
    T_CHECK(o.name && !strcmp(o.name, "nm") && !strcmp(o.buf, "1234567") && !strcmp(o.req, "r"),
            "strings %s %s", o.name ? o.name : "(null)", o.buf);
    T_CHECK(o.flag == 1 && o.on == 1 && o.kind == 7 && o.twice == 42,
            "flag %d on %d kind %d "
            "twice %d",
            o.flag, o.on, o.kind, o.twice);
    T_CHECK(np == 2 && !strcmp(pos[0], "in") && !strcmp(pos[1], "out"), "positionals %d", np);
    o = defaults();
    rc = parse(&s, &o, "--flag=0 --on off --n=0", pos, &np, err, sizeof(err));
    T_CHECK(rc == 0 && o.flag == 0 && o.on == 0 && o.n == 0 && np == 0, "rc %d flag %d on %d", rc,
            o.flag, o.on);
}

/* each bad value is refused with "--name: bad value 'v' (expected ...)" and leaves the field */
static void values_are_range_checked(void) {
    fp8t_opt_spec s = spec(2, 0);
    static const struct {
        const char *line, *needle;
    } bad[] = {
        {"--n 11", "--n: bad value '11' (expected an integer in 0..10)"},
        {"--n -1", "--n: bad value '-1'"},
        {"--n 2.5", "--n: bad value '2.5'"},
        {"--n many", "--n: bad value 'many'"},
        {"--x 1.5", "--x: bad value '1.5' (expected a number in [0, 1])"},
        {"--x nan", "--x: bad value 'nan'"},
        {"--d -6", "--d: bad value '-6' (expected a number in [-5, 5])"},
        {"--seed -1", "--seed: bad value '-1' (expected a non-negative integer)"},
        {"--big 0", "--big: bad value '0' (expected an integer in 1..1000)"},
        {"--big 1001", "--big: bad value '1001'"},
        {"--buf 12345678", "--buf: value too long (at most 7 characters)"},
        {"--on maybe", "--on: bad value 'maybe' (expected 0 or 1)"},
        {"--kind delta", "--kind: bad value 'delta' (expected alpha, beta or gamma)"},
        {"--twice x", "--twice: bad value 'x'"},
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        opts o = defaults(), d = defaults();
        char err[512];
        int rc = parse(&s, &o, bad[k].line, NULL, NULL, err, sizeof(err));
        T_CHECK(rc == -1 && strstr(err, bad[k].needle), "'%s': rc %d, err '%s'", bad[k].line, rc,
                err);
        T_CHECK(memcmp(&o, &d, sizeof(o)) == 0, "'%s' changed the options", bad[k].line);
    }
}

static void unknown_and_missing_are_refused(void) {
    fp8t_opt_spec s = spec(2, 0);
    static const struct {
        const char *line, *needle;
    } bad[] = {
        {"--frobnicate 3", "unknown option '--frobnicate' for fp8train demo"},
        {"--frobnicate=3", "unknown option '--frobnicate' for fp8train demo"},
        {"-q", "unknown option '-q'"},
        {"--n", "--n needs a value (N: a count)"},
        {"--n --flag", "--n needs a value"},
        {"in --name", "--name needs a value"},
        {"a b c", "unexpected argument 'c' (usage: fp8train demo IN [options])"},
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        opts o = defaults();
        const char *pos[2];
        int np;
        char err[512];
        int rc = parse(&s, &o, bad[k].line, pos, &np, err, sizeof(err));
        T_CHECK(rc == -1 && strstr(err, bad[k].needle), "'%s': rc %d, err '%s'", bad[k].line, rc,
                err);
    }
    fp8t_opt_spec none = spec(0, 0);
    opts o = defaults();
    char err[512];
    int rc = parse(&none, &o, "--n 1 extra", NULL, NULL, err, sizeof(err));
    T_CHECK(rc == -1 && strstr(err, "unexpected argument 'extra' (options start with --"),
            "rc %d err '%s'", rc, err);
}

static void help_and_list_requests(void) {
    fp8t_opt_spec s = spec(2, 0);
    opts o = defaults();
    char err[512];
    T_CHECK(parse(&s, &o, "--n 1 --help", NULL, NULL, err, sizeof(err)) == FP8T_OPT_HELP,
            "--help");
    T_CHECK(parse(&s, &o, "-h --frobnicate", NULL, NULL, err, sizeof(err)) == FP8T_OPT_HELP,
            "-h");
    T_CHECK(parse(&s, &o, "--list-options", NULL, NULL, err, sizeof(err)) == FP8T_OPT_LIST,
            "--list-options");
}

/* bisect's mode: what the table does not know goes back in order, values and all */
static void unknown_passed_through(void) {
    fp8t_opt_spec s = spec(-1, 1);
    opts o = defaults();
    const char *pos[16];
    int np = 0;
    char err[512];
    int rc = parse(&s, &o, "--steps 10 --n 4 --out=dir x --flag", pos, &np, err, sizeof(err));
    T_ASSERT(rc == 0, "rc %d: %s", rc, err);
    T_CHECK(o.n == 4 && o.flag == 1, "n %d flag %d", o.n, o.flag);
    T_CHECK(np == 4 && !strcmp(pos[0], "--steps") && !strcmp(pos[1], "10") &&
                !strcmp(pos[2], "--out=dir") && !strcmp(pos[3], "x"),
            "passed %d", np);
}

static char *help_text(const fp8t_opt_spec *s, const void *d) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    fp8t_opt_help(f, s, d);
    fclose(f);
    return text;
}

static void help_is_generated(void) {
    fp8t_opt_spec s = spec(2, 0);
    opts d = defaults();
    char *h = help_text(&s, &d);
    T_ASSERT(h, "no help");
    static const char *const want[] = {"usage: fp8train demo IN [options]\n\nDoes nothing.\n",
                                       "\nNumbers:\n",
                                       "\nText:\n",
                                       "\nOptions:\n",
                                       "--n N",
                                       "(default 3)",
                                       "--x X",
                                       "(default 0.5)",
                                       "(default 1.25)",
                                       "--seed S",
                                       "(default 1337)",
                                       "--name NAME",
                                       "--buf S",
                                       "(default abc)",
                                       "--req R",
                                       "--flag ",
                                       "--on 0|1",
                                       "--kind K",
                                       "(default beta)",
                                       "--twice T",
                                       "(default 8/2)",
                                       "\nexample: fp8train demo in --n 3\n"};
    for (size_t k = 0; k < sizeof(want) / sizeof(want[0]); k++)
        T_CHECK(strstr(h, want[k]), "help lacks '%s':\n%s", want[k], h);
    /* a flag's default is off, an unset string's none; a required row shows no default */
    const char *flag = strstr(h, "--flag ");
    T_CHECK(flag && strstr(flag, "(default off)") < strstr(flag, "--on"), "flag default:\n%s", h);
    const char *name = strstr(h, "--name NAME");
    T_CHECK(name && strstr(name, "(default none)") < strstr(name, "--buf"), "string default");
    const char *req = strstr(h, "--req R");
    T_CHECK(req && (!strstr(req, "(default") || strstr(req, "(default") > strstr(req, "--flag")),
            "a NO_DEFAULT row shows a default:\n%s", h);
    /* wrapped at 60 columns (no word here is longer) */
    for (const char *p = h; *p;) {
        size_t n = strcspn(p, "\n");
        T_CHECK(n <= 60, "line over 60 columns: %.*s", (int)n, p);
        p += n + (p[n] != 0);
    }
    free(h);
    /* the defaults come from the struct given, not from the rows */
    d.n = 9;
    h = help_text(&s, &d);
    T_CHECK(h && strstr(h, "(default 9)"), "default not read from the struct");
    free(h);
}

/* ---- the subcommands, asked of the built binary ---- */

static char bin[4096];

static char *run_capture(const char *cmd) {
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    size_t k;
    while (out && (k = fread(out + n, 1, cap - n - 1, p)) > 0) {
        n += k;
        if (n + 1 == cap) out = realloc(out, cap *= 2);
    }
    pclose(p);
    if (out) out[n] = 0;
    return out;
}

static void commands_list_every_option_in_help(void) {
    FILE *f = fopen(bin, "rb");
    T_ASSERT(f, "no fp8train binary at %s (set FP8TRAIN_BIN)", bin);
    fclose(f);
    for (int c = 0; CONVERTED[c]; c++) {
        char cmd[4400];
        snprintf(cmd, sizeof(cmd), "'%s' %s --list-options 2>&1", bin, CONVERTED[c]);
        char *list = run_capture(cmd);
        snprintf(cmd, sizeof(cmd), "'%s' %s --help 2>&1", bin, CONVERTED[c]);
        char *help = run_capture(cmd);
        T_ASSERT(list && help, "%s: could not run %s", CONVERTED[c], bin);
        int n = 0;
        for (char *line = strtok(list, "\n"); line; line = strtok(NULL, "\n")) {
            /* "--name ARG": the help shows it as "  --name ARG" at the start of a row */
            char row[256];
            snprintf(row, sizeof(row), "\n  %s", line);
            size_t len = strlen(row);
            const char *at = strstr(help, row);
            T_CHECK(line[0] == '-' && at && (at[len] == ' ' || at[len] == '\n'),
                    "fp8train %s --help lacks '%s'", CONVERTED[c], line);
            n++;
        }
        T_CHECK(n > 0, "fp8train %s --list-options listed nothing", CONVERTED[c]);
        T_CHECK(!strncmp(help, "usage: fp8train ", 16), "%s: help starts '%.40s'", CONVERTED[c],
                help);
        free(list);
        free(help);
    }
}

int main(int argc, char **argv) {
    (void)argc;
    t_suite = "opt_table";
    const char *env = getenv("FP8TRAIN_BIN");
    if (env && *env)
        snprintf(bin, sizeof(bin), "%s", env);
    else { /* BUILD/tests/test_opt_table -> BUILD/fp8train */
        snprintf(bin, sizeof(bin), "%s", argv[0]);
        char *slash = strrchr(bin, '/');
        if (slash)
            snprintf(slash + 1, sizeof(bin) - (size_t)(slash + 1 - bin), "../fp8train");
        else
            snprintf(bin, sizeof(bin), "../fp8train");
    }
    T_RUN(every_type_parses);
    T_RUN(values_are_range_checked);
    T_RUN(unknown_and_missing_are_refused);
    T_RUN(help_and_list_requests);
    T_RUN(unknown_passed_through);
    T_RUN(help_is_generated);
    T_RUN(commands_list_every_option_in_help);
    T_MAIN_END();
}
