/* fp8train — how the library reports what goes wrong.
 *   recoverable   functions that can fail take (char *err, size_t errlen) and return -1 with
 *                 err saying what went wrong and the fix (fp8t_errorf); FP8T_ERR_LEN is the
 *                 size of such a buffer everywhere
 *   warnings      what the library notices and goes on from (a policy changed between a
 *                 forward and its backward, a tensor the inspector could not keep, ...): one
 *                 line each to the warning handler (fp8t_set_warn_handler); the library never
 *                 prints on its own
 *   invariants    a broken one is a bug: the message with file and line, then abort()
 *                 (src/util/check.h, FP8T_CHECK; FP8T_FATAL exits for out-of-memory and
 *                 device failures) */
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

/* The size of an error buffer (char err[FP8T_ERR_LEN]). */
#define FP8T_ERR_LEN 2048

/* A warning handler gets each warning as one line without a trailing newline. The default
 * (fn NULL) prints "fp8train: warning: <line>" to stderr. Calls are serialized (the dump writer's
 * thread warns too). */
typedef void (*fp8t_warn_fn)(void *ctx, const char *line);
void fp8t_set_warn_handler(fp8t_warn_fn fn, void *ctx);
/* The handler in place (to restore it after a scope that set its own) */
void fp8t_get_warn_handler(fp8t_warn_fn *fn, void **ctx);
/* Format a warning and hand it to the handler. */
void fp8t_warnf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#ifdef __cplusplus
}
#endif
#endif
