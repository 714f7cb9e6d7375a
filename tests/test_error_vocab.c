/* The library's error vocabulary (fp8train/error.h, src/util/check.h):
 *   - warnings reach the handler in place as one formatted line; get returns the handler, and
 *     setting NULL goes back to the default (stderr);
 *   - FP8T_FATAL prints "fp8train: <message> (file:line)" and exits 1; a failed FP8T_CHECK
 *     prints "fp8train: internal error (file:line): <message>" and aborts (each in a child);
 *   - FP8T_FATAL leaves through the exit a world of several ranks installs (MPI_Abort). */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fp8train/error.h"
#include "test.h"
#include "util/check.h"

static char got[FP8T_ERR_LEN];
static int calls;
static void capture(void *ctx, const char *line) {
    calls += ctx == (void *)&calls;
    snprintf(got, sizeof got, "%s", line);
}

static void warnings_reach_the_handler(void) {
    fp8t_warn_fn fn0;
    void *ctx0;
    fp8t_get_warn_handler(&fn0, &ctx0);
    T_CHECK(fn0 == NULL, "a handler is set before any was");
    fp8t_set_warn_handler(capture, &calls);
    fp8t_warnf("layer %d: %s", 3, "no amax");
    T_CHECK(calls == 1 && !strcmp(got, "layer 3: no amax"), "%d calls, '%s'", calls, got);
    fp8t_warn_fn fn;
    void *ctx;
    fp8t_get_warn_handler(&fn, &ctx);
    T_CHECK(fn == capture && ctx == &calls, "get does not return the handler set");
    fp8t_set_warn_handler(NULL, NULL);
    fp8t_warnf("to stderr");
    T_CHECK(calls == 1, "the handler was called after it was unset");
}

/* the child's stderr and how it ended */
static int run_child(void (*fn)(void), char *err, size_t len, int *status) {
    int fd[2];
    if (pipe(fd) != 0) return -1;
    pid_t p = fork();
    if (p == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        fn();
        _exit(0);
    }
    close(fd[1]);
    size_t got_n = 0;
    ssize_t n;
    while (got_n < len - 1 && (n = read(fd[0], err + got_n, len - 1 - got_n)) > 0)
        got_n += (size_t)n;
    err[got_n] = 0;
    close(fd[0]);
    waitpid(p, status, 0);
    return 0;
}

static void fatal_child(void) { FP8T_FATAL("out of memory allocating %d bytes", 42); }
/* what a world of several ranks installs (MPI_Abort): called with the code after the message */
static void world_exit(int code) { _exit(40 + code); }
static void fatal_world_child(void) {
    fp8t_set_fatal_exit(world_exit);
    FP8T_FATAL("NCCL %s failed", "allreduce");
}
static void check_child(void) {
    const int rows = 3;
    FP8T_CHECK(rows == 4, "rows = %d, expected 4", rows);
}

static void fatal_and_check(void) {
    char err[512];
    int st;
    T_ASSERT(run_child(fatal_child, err, sizeof err, &st) == 0, "fork");
    T_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "FP8T_FATAL: status %d", st);
    T_CHECK(strstr(err, "fp8train: out of memory allocating 42 bytes (tests/test_error_vocab.c:"),
            "FP8T_FATAL printed '%s'", err);
    T_ASSERT(run_child(fatal_world_child, err, sizeof err, &st) == 0, "fork");
    T_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 41, "FP8T_FATAL with a world exit: status %d",
            st);
    T_CHECK(strstr(err, "fp8train: NCCL allreduce failed (tests/test_error_vocab.c:"),
            "FP8T_FATAL with a world exit printed '%s'", err);
    T_ASSERT(run_child(check_child, err, sizeof err, &st) == 0, "fork");
    T_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "FP8T_CHECK: status %d", st);
    T_CHECK(strstr(err, "fp8train: internal error (tests/test_error_vocab.c:") &&
                strstr(err, "): rows = 3, expected 4"),
            "FP8T_CHECK printed '%s'", err);
}

int main(void) {
    t_suite = "error_vocab";
    T_RUN(warnings_reach_the_handler);
    T_RUN(fatal_and_check);
    T_MAIN_END();
}
