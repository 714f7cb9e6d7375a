/* Backend registry: pick an implementation of the op table by name. The CUDA backend is
 * linked only into builds made with nvcc; the weak reference lets the CPU-only library (tests,
 * sanitizer builds) link without it and report a clear error instead. Also the RoPE frequencies
 * both backends build their tables from (fp8t_rope_inv_freq). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fp8train/backend.h"

extern fp8t_backend *fp8t_cuda_backend_create(const fp8t_backend_options *opt, char *err,
                                              size_t errlen) __attribute__((weak));

static const char *const ATTN_NAMES[FP8T_ATTN_IMPL_COUNT] = {
    [FP8T_ATTN_DEFAULT] = "default", [FP8T_ATTN_FLASH] = "flash", [FP8T_ATTN_GEMM] = "gemm",
    [FP8T_ATTN_TILED] = "tiled",     [FP8T_ATTN_SIMPLE] = "simple", [FP8T_ATTN_CUDNN] = "cudnn",
};

const char *fp8t_attn_impl_name(fp8t_attn_impl a) {
    return a >= 0 && a < FP8T_ATTN_IMPL_COUNT ? ATTN_NAMES[a] : NULL;
}

int fp8t_attn_impl_parse(fp8t_attn_impl *out, const char *name) {
    for (int a = 0; a < FP8T_ATTN_IMPL_COUNT; a++)
        if (name && ATTN_NAMES[a] && strcmp(name, ATTN_NAMES[a]) == 0) {
            *out = (fp8t_attn_impl)a;
            return 0;
        }
    return -1;
}

const char *fp8t_attn_impl_names(void) {
    /* the table's names after "default", in its order (test_backend_options checks it) */
    return "flash, gemm, tiled, simple, cudnn";
}

fp8t_backend *fp8t_backend_create(const char *name, const fp8t_backend_options *opt, char *err,
                                  size_t errlen) {
    static const fp8t_backend_options defaults; /* zero: every path on, the default kernels */
    if (!opt) opt = &defaults;
    if (opt->attn < 0 || opt->attn >= FP8T_ATTN_IMPL_COUNT) {
        snprintf(err, errlen, "attention implementation %d is none of %s", (int)opt->attn,
                 fp8t_attn_impl_names());
        return NULL;
    }
    if (!name || strcmp(name, "cpu") == 0) return fp8t_cpu_backend_create(opt, err, errlen);
    if (strcmp(name, "cuda") == 0) {
        if (!fp8t_cuda_backend_create) {
            snprintf(err, errlen,
                     "this fp8train was built without the CUDA backend; rebuild with nvcc on "
                     "PATH (make clean && make) or use --device cpu");
            return NULL;
        }
        return fp8t_cuda_backend_create(opt, err, errlen);
    }
    snprintf(err, errlen, "unknown device '%s' (expected cpu or cuda)", name);
    return NULL;
}

void fp8t_backend_destroy(fp8t_backend *b) {
    if (b) b->ops->destroy(b);
}

double fp8t_rope_inv_freq(const fp8t_attn_shape *s, int i) {
    /* the plain RoPE frequency, the expression the CPU tables always used (bit-for-bit) */
    const double f = pow((double)s->rope_theta, -2.0 * i / s->HS);
    const fp8t_rope_scaling *r = &s->rope_scaling;
    if (r->type != FP8T_ROPE_LLAMA3) return f;
    /* Llama 3.1+: wavelengths longer than original_max_pos / low_freq_factor are stretched by
     * factor (long-range positions), shorter than original_max_pos / high_freq_factor are
     * kept, and the band between blends the two linearly in original_max_pos / wavelength. */
    const double pi = 3.14159265358979323846;
    const double factor = r->factor, lo = r->low_freq_factor, hi = r->high_freq_factor;
    const double ctx = (double)r->original_max_pos;
    const double wavelen = 2.0 * pi / f;
    if (wavelen < ctx / hi) return f;
    if (wavelen > ctx / lo) return f / factor;
    const double smooth = (ctx / wavelen - lo) / (hi - lo);
    return (1.0 - smooth) * f / factor + smooth * f;
}
