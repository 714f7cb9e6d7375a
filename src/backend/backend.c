/* Backend registry: pick an implementation of the op table by name. The CUDA backend is
 * linked only into builds made with nvcc; the weak reference lets the CPU-only library (tests,
 * sanitizer builds) link without it and report a clear error instead. Also the RoPE frequencies
 * both backends build their tables from (fp8t_rope_inv_freq). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "fp8train/backend.h"
#include "fp8train/error.h"

/* ---- the op table's names (FP8T_BACKEND_OPS), checked against the struct field for field:
 * each op at its index's offset, and as many ops as the struct has room for */
#define OP_INDEX(name) OPI_##name,
enum { FP8T_BACKEND_OPS(OP_INDEX) OP_COUNT };
typedef fp8t_backend_op_fn op_fn;
#define OP_PLACE(name)                                                                           \
    _Static_assert(offsetof(fp8t_backend_ops, name) == OPI_##name * sizeof(op_fn),               \
                   "FP8T_BACKEND_OPS: " #name " is not at its place in fp8t_backend_ops");
FP8T_BACKEND_OPS(OP_PLACE)
_Static_assert(sizeof(fp8t_backend_ops) == OP_COUNT * sizeof(op_fn),
               "FP8T_BACKEND_OPS does not list every op of fp8t_backend_ops");
#define OP_NAME(name) #name,
static const char *const OP_NAMES[OP_COUNT] = {FP8T_BACKEND_OPS(OP_NAME)};

const char *fp8t_backend_op_name(int i) { return i >= 0 && i < OP_COUNT ? OP_NAMES[i] : NULL; }
int fp8t_backend_op_count(void) { return OP_COUNT; }

fp8t_backend_op_fn fp8t_backend_op(const fp8t_backend_ops *ops, int i) {
    op_fn f = NULL;
    if (i >= 0 && i < OP_COUNT)
        memcpy(&f, (const char *)ops + (size_t)i * sizeof(op_fn), sizeof f);
    return f;
}

int fp8t_backend_op_optional(int i) { return i >= OPI_graph_begin && i <= OPI_prefetch_l2; }

int fp8t_backend_first_unset_op(const fp8t_backend_ops *ops) {
    for (int i = 0; i < OP_COUNT; i++)
        if (!fp8t_backend_op(ops, i) && !fp8t_backend_op_optional(i)) return i;
    return -1;
}

/* b, or NULL after a message in err when its table leaves an op unset (a designated
 * initializer forgotten: the op would be a NULL call at its first use) */
static fp8t_backend *checked(fp8t_backend *b, char *err, size_t errlen) {
    if (!b) return NULL;
    const int i = fp8t_backend_first_unset_op(b->ops);
    if (i < 0) return b;
    fp8t_errorf(err, errlen,
                "the %s backend's op table leaves op '%s' unset (a build error: every "
                "op of fp8t_backend_ops needs an implementation)",
                b->name, OP_NAMES[i]);
    fp8t_backend_destroy(b);
    return NULL;
}

extern fp8t_backend *fp8t_cuda_backend_create(const fp8t_backend_options *opt, char *err,
                                              size_t errlen) __attribute__((weak));

static const char *const ATTN_NAMES[FP8T_ATTN_IMPL_COUNT] = {
    [FP8T_ATTN_DEFAULT] = "default", [FP8T_ATTN_FLASH] = "flash",   [FP8T_ATTN_GEMM] = "gemm",
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
        fp8t_errorf(err, errlen, "attention implementation %d is none of %s", (int)opt->attn,
                    fp8t_attn_impl_names());
        return NULL;
    }
    if (!name || strcmp(name, "cpu") == 0)
        return checked(fp8t_cpu_backend_create(opt, err, errlen), err, errlen);
    if (strcmp(name, "cuda") == 0) {
        if (!fp8t_cuda_backend_create) {
            fp8t_errorf(err, errlen,
                        "this fp8train was built without the CUDA backend; rebuild with nvcc on "
                        "PATH (make clean && make) or use --device cpu");
            return NULL;
        }
        return checked(fp8t_cuda_backend_create(opt, err, errlen), err, errlen);
    }
    fp8t_errorf(err, errlen, "unknown device '%s' (expected cpu or cuda)", name);
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
