/* Backend registry: pick an implementation of the op table by name. The CUDA backend is
 * linked only into builds made with nvcc; the weak reference lets the CPU-only library (tests,
 * sanitizer builds) link without it and report a clear error instead. */
#include <stdio.h>
#include <string.h>

#include "fp8train/backend.h"

extern fp8t_backend *fp8t_cuda_backend_create(char *err, size_t errlen) __attribute__((weak));

fp8t_backend *fp8t_backend_create(const char *name, char *err, size_t errlen) {
    if (!name || strcmp(name, "cpu") == 0) return fp8t_cpu_backend_create(err, errlen);
    if (strcmp(name, "cuda") == 0) {
        if (!fp8t_cuda_backend_create) {
            snprintf(err, errlen,
                     "this fp8train was built without the CUDA backend; rebuild with nvcc on "
                     "PATH (make clean && make) or use --device cpu");
            return NULL;
        }
        return fp8t_cuda_backend_create(err, errlen);
    }
    snprintf(err, errlen, "unknown device '%s' (expected cpu or cuda)", name);
    return NULL;
}

void fp8t_backend_destroy(fp8t_backend *b) {
    if (b) b->ops->destroy(b);
}
