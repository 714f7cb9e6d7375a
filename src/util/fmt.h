/* fp8train — bounded formatting that reports truncation. Private to the library (src/). */
#ifndef FP8TRAIN_UTIL_FMT_H
#define FP8TRAIN_UTIL_FMT_H

#include <stddef.h>

/* snprintf into buf; 0 if it fit, -1 if the result was truncated (paths built from options
 * of bounded length, so truncation is an error to report, not to ignore). */
int fp8t_fmt(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
