/* fp8train — the library's two ways to stop (private to src/):
 *   FP8T_CHECK(cond, fmt, ...)  an invariant of the code: when it does not hold, a bug; the
 *                               message with file and line, then abort() (a core to debug)
 *   FP8T_FATAL(fmt, ...)        an unrecoverable condition that is not a bug (out of memory, a
 *                               CUDA error that leaves the context unusable): the message with
 *                               file and line, then exit(1)
 * Everything a caller can recover from returns -1 with an error message instead
 * (fp8t_errorf, fp8train/error.h); warnings go through fp8t_warnf. */
#ifndef FP8TRAIN_UTIL_CHECK_H
#define FP8TRAIN_UTIL_CHECK_H

#ifdef __cplusplus
extern "C" {
#endif

/* "fp8train: internal error (file:line): message", then abort() */
void fp8t_check_failed(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
/* "fp8train: message (file:line)", then exit(1) */
void fp8t_fatal(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
/* FP8T_FATAL's way out after its message: exit() by default. A world of several processes
 * sets one that stops every rank (src/backend/dist.c: MPI_Abort), so that a rank's fatal
 * error never leaves the others waiting in a collective. It must not return. NULL: exit(). */
void fp8t_set_fatal_exit(void (*exit_fn)(int code));

#ifdef __cplusplus
}
#endif

#define FP8T_CHECK(cond, ...)                                                                    \
    do {                                                                                         \
        if (!(cond)) fp8t_check_failed(__FILE__, __LINE__, __VA_ARGS__);                         \
    } while (0)

#define FP8T_FATAL(...) fp8t_fatal(__FILE__, __LINE__, __VA_ARGS__)

#endif
