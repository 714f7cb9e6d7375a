/* fp8train — a minimal test harness. Each tests/test_*.c is one program; each check prints
 * one line, "PASS suite: name" or "FAIL suite: name: why (file:line)", and tests/run.sh
 * counts them. A test program exits nonzero when any check failed. */
#ifndef FP8TRAIN_TEST_H
#define FP8TRAIN_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_failed_total = 0, t_passed_total = 0;
static int t_cur_failed = 0;
static const char *t_suite = "test";

/* Fail the current test with a printf-style message; keeps going (the test decides whether
 * to return). */
#define T_FAIL(...)                                                                              \
    do {                                                                                         \
        if (!t_cur_failed) {                                                                     \
            printf("  ");                                                                        \
            printf(__VA_ARGS__);                                                                 \
            printf(" (%s:%d)\n", __FILE__, __LINE__);                                            \
        }                                                                                        \
        t_cur_failed = 1;                                                                        \
    } while (0)

#define T_CHECK(cond, ...)                                                                       \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            T_FAIL("check failed: %s: ", #cond);                                                 \
            printf("    ");                                                                      \
            printf(__VA_ARGS__);                                                                 \
            printf("\n");                                                                        \
        }                                                                                        \
    } while (0)

#define T_ASSERT(cond, ...)                                                                      \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            T_FAIL("assertion failed: %s", #cond);                                               \
            printf("    ");                                                                      \
            printf(__VA_ARGS__);                                                                 \
            printf("\n");                                                                        \
            return;                                                                              \
        }                                                                                        \
    } while (0)

/* |a-b| <= atol + rtol*|b|, NaN never passes */
#define T_CLOSE(a, b, atol, rtol)                                                                \
    do {                                                                                         \
        double t_a_ = (double)(a), t_b_ = (double)(b);                                           \
        if (!(fabs(t_a_ - t_b_) <= (atol) + (rtol)*fabs(t_b_)))                                  \
            T_FAIL("%s = %.9g not close to %s = %.9g (atol %g rtol %g)", #a, t_a_, #b, t_b_,     \
                   (double)(atol), (double)(rtol));                                              \
    } while (0)

#define T_RUN(fn)                                                                                \
    do {                                                                                         \
        t_cur_failed = 0;                                                                        \
        fflush(stdout);                                                                          \
        fn();                                                                                    \
        if (t_cur_failed) {                                                                      \
            printf("FAIL %s: %s\n", t_suite, #fn);                                               \
            t_failed_total++;                                                                    \
        } else {                                                                                 \
            printf("PASS %s: %s\n", t_suite, #fn);                                               \
            t_passed_total++;                                                                    \
        }                                                                                        \
        fflush(stdout);                                                                          \
    } while (0)

#define T_MAIN_END() return t_failed_total ? 1 : 0

#endif
