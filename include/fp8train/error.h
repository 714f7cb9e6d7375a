/* fp8train — the library's printf-style error helper. Functions that can fail take
 * (char *err, size_t errlen) and return -1 with err saying what went wrong and the fix. */
#ifndef FP8TRAIN_ERROR_H
#define FP8TRAIN_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Format into err (nothing when err is NULL or errlen is 0; truncated to errlen) and return
 * -1, so a failure path reads `return fp8t_errorf(err, errlen, "%s: ...", path);`. */
int fp8t_errorf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif
#endif
