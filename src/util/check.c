/* FP8T_CHECK / FP8T_FATAL (util/check.h). */
#include "util/check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void fp8t_check_failed(const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "fp8train: internal error (%s:%d): ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

static void (*g_fatal_exit)(int code);

void fp8t_set_fatal_exit(void (*exit_fn)(int code)) { g_fatal_exit = exit_fn; }

void fp8t_fatal(const char *file, int line, const char *fmt, ...) {
    fputs("fp8train: ", stderr);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (%s:%d)\n", file, line);
    if (g_fatal_exit) g_fatal_exit(1);
    exit(1);
}
