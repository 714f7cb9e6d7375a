/* fp8t_errorf and the warnings: see include/fp8train/error.h. */
#include <pthread.h>
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

static pthread_mutex_t warn_lock = PTHREAD_MUTEX_INITIALIZER;
static fp8t_warn_fn warn_fn;
static void *warn_ctx;

void fp8t_set_warn_handler(fp8t_warn_fn fn, void *ctx) {
    pthread_mutex_lock(&warn_lock);
    warn_fn = fn;
    warn_ctx = ctx;
    pthread_mutex_unlock(&warn_lock);
}

void fp8t_get_warn_handler(fp8t_warn_fn *fn, void **ctx) {
    pthread_mutex_lock(&warn_lock);
    *fn = warn_fn;
    *ctx = warn_ctx;
    pthread_mutex_unlock(&warn_lock);
}

void fp8t_warnf(const char *fmt, ...) {
    char line[FP8T_ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&warn_lock);
    if (warn_fn)
        warn_fn(warn_ctx, line);
    else
        fprintf(stderr, "fp8train: warning: %s\n", line);
    pthread_mutex_unlock(&warn_lock);
}
