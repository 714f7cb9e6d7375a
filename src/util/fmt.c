/* fp8t_fmt: snprintf that reports truncation (util/fmt.h). */
#include <stdarg.h>
#include <stdio.h>

#include "util/fmt.h"

int fp8t_fmt(char *buf, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}
