/* fp8train — statistics of a tensor and of its FP8 image. Accumulated in double (with
 * Kahan/pairwise summation where it matters) so that e.g. the cosine of a tensor with itself is
 * 1 within 1e-12. Non-finite elements are counted and excluded from the moments. */
#ifndef FP8TRAIN_STATS_H
#define FP8TRAIN_STATS_H

#include <stddef.h>
#include "fp8train/fp8.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    size_t n;          /* elements */
    size_t n_nan, n_inf, n_zero;
    double min, max, mean, std; /* over finite elements; std is the population std */
    double l1, l2;     /* sum |x|, sqrt(sum x^2) */
    double amax;       /* max |x| over finite elements */
    double dynamic_range; /* log2(amax) - log2(smallest nonzero |x|); 0 if no nonzero */
    /* Against a quantized image (fp8t_fp8_stats) or another tensor (fp8t_compare_stats);
     * 0 when not computed: */
    double underflow_pct;  /* % of nonzero elements that became zero */
    double saturation_pct; /* % of elements whose |x*scale| exceeded the format max
                              (clamped, or NaN/Inf without saturation) */
    double mse;            /* mean (q - x)^2 */
    double cosine;         /* <x,q> / (|x| |q|); 1 if both are all zero */
    double sqnr_db;        /* 10 log10(sum x^2 / sum (q-x)^2); +inf (1e300) if exact */
} fp8t_stats;

/* Statistics of x alone. */
void fp8t_tensor_stats(fp8t_stats *out, const float *x, size_t n);
/* Statistics of x plus the error of its FP8 image q = dequant(quant(x*scale)) / scale
 * (saturating cast, as training uses). */
void fp8t_fp8_stats(fp8t_stats *out, const float *x, size_t n, float scale, fp8_format fmt);
/* Statistics of ref plus the error of test against ref (mse, cosine, sqnr). */
void fp8t_compare_stats(fp8t_stats *out, const float *ref, const float *test, size_t n);
/* Per block of `block` consecutive elements (last partial): out has ceil(n/block) entries,
 * each as fp8t_fp8_stats of that block with the same per-tensor scale. */
void fp8t_block_fp8_stats(fp8t_stats *out, const float *x, size_t n, size_t block, float scale,
                          fp8_format fmt);

#ifdef __cplusplus
}
#endif
#endif
