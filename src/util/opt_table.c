/* Option tables (see opt_table.h): parsing argv into an options struct, and the --help text,
 * both from the same rows. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/error.h"
#include "util/opt_table.h"

#define HELP_LHS                                                                                 \
    28 /* the column of "--name ARG" in --help; longer ones get a line of their own */

const fp8t_opt *fp8t_opt_find(const fp8t_opt *t, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0) return &t[i];
    return NULL;
}

static int bad_value(char *err, size_t errlen, const char *name, const char *v,
                     const char *expect) {
    return fp8t_errorf(err, errlen, "--%s: bad value '%s' (expected %s)", name, v, expect);
}

static int parse_bool(const char *v, int *out) {
    if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on"))
        *out = 1;
    else if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off"))
        *out = 0;
    else
        return -1;
    return 0;
}

/* "a, b or c" of a CHOICE row's names */
static void choice_list(const fp8t_opt *o, char *buf, size_t len) {
    size_t n = 0;
    int k = 0;
    while (o->choices[k].name) k++;
    buf[0] = 0;
    for (int j = 0; j < k && n < len; j++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s",
                              j == 0       ? ""
                              : j + 1 == k ? " or "
                                           : ", ",
                              o->choices[j].name);
}

int fp8t_opt_set(const fp8t_opt *o, void *obj, const char *v, char *err, size_t errlen) {
    char *base = (char *)obj + o->off;
    char expect[256];
    if (!v) v = "1"; /* a flag given alone */
    switch (o->type) {
    case FP8T_OPT_INT: {
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        snprintf(expect, sizeof(expect), "an integer in %.0f..%.0f", o->lo, o->hi);
        if (errno || end == v || *end || x < o->lo || x > o->hi)
            return bad_value(err, errlen, o->name, v, expect);
        *(int *)base = (int)x;
        return 0;
    }
    case FP8T_OPT_FLOAT: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        int ranged = o->hi > o->lo;
        if (ranged)
            snprintf(expect, sizeof(expect), "a number in [%g, %g]", o->lo, o->hi);
        else
            snprintf(expect, sizeof(expect), "a number");
        if (errno || end == v || *end || !isfinite(x) || (ranged && (x < o->lo || x > o->hi)))
            return bad_value(err, errlen, o->name, v, expect);
        if (o->size == sizeof(double))
            *(double *)base = x;
        else
            *(float *)base = (float)x;
        return 0;
    }
    case FP8T_OPT_U64: {
        char *end;
        errno = 0;
        int ranged = o->hi > o->lo;
        if (ranged)
            snprintf(expect, sizeof(expect), "an integer in %.0f..%.0f", o->lo, o->hi);
        else
            snprintf(expect, sizeof(expect), "a non-negative integer");
        /* strtoull would take "-1" as 2^64 - 1 */
        if (*v == '-') return bad_value(err, errlen, o->name, v, expect);
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || end == v || *end || (ranged && ((double)x < o->lo || (double)x > o->hi)))
            return bad_value(err, errlen, o->name, v, expect);
        *(uint64_t *)base = x;
        return 0;
    }
    case FP8T_OPT_STR: *(const char **)base = v; return 0;
    case FP8T_OPT_STRBUF:
        if (strlen(v) >= o->size) {
            return fp8t_errorf(err, errlen, "--%s: value too long (at most %zu characters)",
                               o->name, o->size - 1);
        }
        strcpy(base, v);
        return 0;
    case FP8T_OPT_FLAG:
    case FP8T_OPT_BOOL: {
        int b;
        if (parse_bool(v, &b) != 0) return bad_value(err, errlen, o->name, v, "0 or 1");
        *(int *)base = b;
        return 0;
    }
    case FP8T_OPT_CHOICE:
        for (int k = 0; o->choices[k].name; k++)
            if (!strcmp(o->choices[k].name, v)) {
                *(int *)base = o->choices[k].value;
                return 0;
            }
        choice_list(o, expect, sizeof(expect));
        return bad_value(err, errlen, o->name, v, expect);
    case FP8T_OPT_SPECIAL:
        if (!o->set) {
            return fp8t_errorf(err, errlen, "--%s cannot be set here", o->name);
        }
        return o->set(obj, v, err, errlen);
    }
    return -1;
}

void fp8t_opt_get(const fp8t_opt *o, const void *obj, char *buf, size_t len) {
    const char *base = (const char *)obj + o->off;
    buf[0] = 0;
    switch (o->type) {
    case FP8T_OPT_INT:
    case FP8T_OPT_FLAG:
    case FP8T_OPT_BOOL: snprintf(buf, len, "%d", *(const int *)base); break;
    case FP8T_OPT_FLOAT:
        snprintf(buf, len, "%g",
                 o->size == sizeof(double) ? *(const double *)base
                                           : (double)*(const float *)base);
        break;
    case FP8T_OPT_U64:
        snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)base);
        break;
    case FP8T_OPT_STR: {
        const char *s = *(const char *const *)base;
        snprintf(buf, len, "%s", s ? s : "");
        break;
    }
    case FP8T_OPT_STRBUF: snprintf(buf, len, "%s", base); break;
    case FP8T_OPT_CHOICE:
        for (int k = 0; o->choices[k].name; k++)
            if (o->choices[k].value == *(const int *)base) {
                snprintf(buf, len, "%s", o->choices[k].name);
                break;
            }
        break;
    case FP8T_OPT_SPECIAL:
        if (o->get) o->get(obj, buf, len);
        break;
    }
}

fp8t_opt_step fp8t_opt_next(const fp8t_opt_spec *s, int argc, char **argv, int *i,
                            const fp8t_opt **row, const char **value, char *err, size_t errlen) {
    *row = NULL;
    *value = NULL;
    if (*i >= argc) return FP8T_OPT_END;
    const char *a = argv[(*i)++];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return FP8T_OPT_HELP;
    if (!strcmp(a, "--list-options")) return FP8T_OPT_LIST;
    /* "-" alone is a positional (stdin, by convention); "-x" is an option no table has */
    if (a[0] != '-' || !a[1]) {
        if (s->max_pos == 0 && !s->pass_unknown) {
            fp8t_errorf(err, errlen,
                        "unexpected argument '%s' (options start with --; see fp8train "
                        "%s --help)",
                        a, s->cmd);
            return FP8T_OPT_ERROR;
        }
        *value = a;
        return FP8T_OPT_POSITIONAL;
    }
    /* "--name" or "--name=value"; a single-dash "-x" is no table's (only -h is known) */
    char name[64];
    const char *eq = strchr(a, '=');
    const size_t alen = eq ? (size_t)(eq - a) : strlen(a);
    const fp8t_opt *o = NULL;
    if (a[1] == '-' && alen - 2 < sizeof(name)) {
        snprintf(name, sizeof(name), "%.*s", (int)(alen - 2), a + 2);
        o = fp8t_opt_find(s->opts, s->n_opts, name);
    }
    if (!o) {
        if (s->pass_unknown) {
            *value = a;
            return FP8T_OPT_POSITIONAL;
        }
        fp8t_errorf(err, errlen,
                    "unknown option '%.*s' for fp8train %s (see fp8train %s --help "
                    "for the list)",
                    (int)alen, a, s->cmd, s->cmd);
        return FP8T_OPT_ERROR;
    }
    *row = o;
    if (eq)
        *value = eq + 1;
    else if (o->type != FP8T_OPT_FLAG) {
        /* "--steps --out DIR": the value was forgotten, rather than "--out" being it */
        if (*i >= argc || !strncmp(argv[*i], "--", 2)) {
            fp8t_errorf(err, errlen, "--%s needs a value (%s: %s)", o->name,
                        o->arg ? o->arg : "X", o->help);
            return FP8T_OPT_ERROR;
        }
        *value = argv[(*i)++];
    }
    return FP8T_OPT_OPTION;
}

int fp8t_opt_parse(const fp8t_opt_spec *s, void *obj, int argc, char **argv, const char **pos,
                   int *n_pos, char *err, size_t errlen) {
    int i = 0, np = 0;
    for (;;) {
        const fp8t_opt *o;
        const char *v;
        const char *a = i < argc ? argv[i] : NULL;
        switch (fp8t_opt_next(s, argc, argv, &i, &o, &v, err, errlen)) {
        case FP8T_OPT_END:
            if (n_pos) *n_pos = np;
            return 0;
        case FP8T_OPT_HELP: return FP8T_OPT_HELP;
        case FP8T_OPT_LIST: return FP8T_OPT_LIST;
        case FP8T_OPT_ERROR: return -1;
        case FP8T_OPT_POSITIONAL:
            if (!s->pass_unknown && s->max_pos >= 0 && np >= s->max_pos) {
                return fp8t_errorf(err, errlen,
                                   "unexpected argument '%s' (usage: fp8train %s %s)", a, s->cmd,
                                   s->usage);
            }
            if (pos) pos[np] = v;
            np++;
            break;
        case FP8T_OPT_OPTION:
            if (fp8t_opt_set(o, obj, v, err, errlen) != 0) return -1;
            break;
        }
    }
}

/* ---------------------------------------------------------------- help */

/* text from column `col`, words wrapped at `wrap` (0: not at all) onto lines indented to
 * `indent` */
static void put_wrapped(FILE *f, const char *text, int col, int indent, int wrap) {
    if (wrap <= 0) {
        fprintf(f, "%s\n", text);
        return;
    }
    const char *p = text;
    int first = 1;
    while (*p) {
        while (*p == ' ') p++;
        size_t w = strcspn(p, " ");
        if (!w) break;
        if (!first && col + 1 + (int)w > wrap) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
            first = 1;
        }
        if (!first) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", (int)w, p);
        col += (int)w;
        p += w;
        first = 0;
    }
    fputc('\n', f);
}

void fp8t_opt_help(FILE *f, const fp8t_opt_spec *s, const void *defaults) {
    fprintf(f, "usage: fp8train %s %s\n", s->cmd, s->usage);
    if (s->about) fprintf(f, "\n%s", s->about);
    const char *group = NULL;
    for (int i = 0; i < s->n_opts; i++) {
        const fp8t_opt *o = &s->opts[i];
        const char *g = o->group ? o->group : "Options";
        if (!group || strcmp(g, group) != 0) {
            group = g;
            fprintf(f, "\n%s:\n", group);
        }
        char lhs[96], def[512], text[2048];
        snprintf(lhs, sizeof(lhs), "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        if (o->dflt)
            snprintf(def, sizeof(def), "%s", o->dflt);
        else if (o->type == FP8T_OPT_FLAG)
            snprintf(def, sizeof(def), "off");
        else {
            fp8t_opt_get(o, defaults, def, sizeof(def));
            if (!def[0]) snprintf(def, sizeof(def), "none");
        }
        if (def[0])
            snprintf(text, sizeof(text), "%s (default %s)", o->help, def);
        else
            snprintf(text, sizeof(text), "%s", o->help);
        const int indent = 2 + HELP_LHS + 1;
        if ((int)strlen(lhs) > HELP_LHS)
            fprintf(f, "  %s\n  %-*s ", lhs, HELP_LHS, "");
        else
            fprintf(f, "  %-*s ", HELP_LHS, lhs);
        put_wrapped(f, text, indent, indent, s->wrap);
    }
    if (s->epilog) fprintf(f, "\n%s", s->epilog);
}

void fp8t_opt_list(FILE *f, const fp8t_opt_spec *s) {
    for (int i = 0; i < s->n_opts; i++)
        fprintf(f, "--%s%s%s\n", s->opts[i].name, s->opts[i].arg ? " " : "",
                s->opts[i].arg ? s->opts[i].arg : "");
}
