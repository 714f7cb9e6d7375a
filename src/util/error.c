/* fp8t_errorf: see include/fp8train/error.h. */
#include <stdarg.h>
#include <stdio.h>

#include "fp8train/error.h"

int fp8t_errorf(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}
