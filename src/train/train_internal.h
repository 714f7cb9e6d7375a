/* Private helpers shared by the files of src/train. */
#ifndef FP8TRAIN_TRAIN_INTERNAL_H
#define FP8TRAIN_TRAIN_INTERNAL_H

#include <stddef.h>

#define FP8T_TRAIN_PATH_BUF 4096

/* snprintf into buf; 0 if it fit, -1 if the result was truncated (paths built from options
 * of bounded length, so truncation is an error to report, not to ignore). */
int fp8t_fmt(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
