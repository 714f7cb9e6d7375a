/* Small helpers for the training code. */
#include <stdarg.h>
#include <stdio.h>

#include "train/train_internal.h"

int fp8t_fmt(char *buf, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}
