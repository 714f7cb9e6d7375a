/* fp8train — statistics of a tensor and of its FP8 image. Accumulated in double (with
 * Kahan/pairwise summation where it matters) so that e.g. the cosine of a tensor with itself is
 * 1 within 1e-12. Non-finite elements are counted and excluded from the moments. */
#ifndef FP8TRAIN_STATS_H
#define FP8TRAIN_STATS_H

#include <stddef.h>
#include <stdint.h>
#include "fp8train/fp8.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    size_t n; /* elements */
    size_t n_nan, n_inf, n_zero;
    double min, max, mean, std; /* over finite elements; std is the population std */
    double l1, l2;              /* sum |x|, sqrt(sum x^2) */
    double amax;                /* max |x| over finite elements */
    double dynamic_range;       /* log2(amax) - log2(smallest nonzero |x|); 0 if no nonzero */
    /* Against a quantized image (fp8t_fp8_stats) or another tensor (fp8t_compare_stats);
     * 0 when not computed: */
    double underflow_pct;  /* % of nonzero elements that became zero */
    double saturation_pct; /* % of finite elements the saturating cast clipped: |x*scale|
                              rounds above the format max (fp8_overflows) */
    double mse;            /* mean (q - x)^2 */
    double cosine;         /* <x,q> / (|x| |q|); 1 if both are all zero */
    double sqnr_db;        /* 10 log10(sum x^2 / sum (q-x)^2); +inf (1e300) if exact */
} fp8t_stats;

/* 1 if the FP8 cast of v overflows: v (finite or not) rounds to a magnitude above the
 * format max, so the saturating cast clips it to +-max (and the other gives NaN / Inf). */
int fp8_overflows(float v, fp8_format fmt);

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

/* ---- raw statistics: what the backend op tensor_stats computes (backend.h) ----
 * A tensor x [rows, cols] and up to FP8T_STATS_MAX_IMAGES FP8 images of it, each made with
 * its own recipe (the one a GEMM uses, and what-ifs: the same tensor under other recipes).
 * The op fills an fp8t_stats_raw in device memory in one call (a few kernels, fixed-order
 * reductions, nothing waits); only that struct (about 1 KiB) crosses to the host, where
 * fp8t_stats_from_raw turns it into fp8t_stats. The CPU backend's op is
 * fp8t_stats_raw_compute, the reference the CUDA op is tested against (tests/gpu). */
#define FP8T_STATS_MAX_IMAGES 8

typedef enum {
    FP8T_IMG_SCALE = 0, /* per-tensor scale read from a device pointer (delayed scaling) */
    FP8T_IMG_CURRENT,   /* per-tensor current scaling: fp8t_current_scale(amax(x), ...) */
    FP8T_IMG_TILES,     /* tile_r x tile_c blocks, each its own current scale (block scaling) */
    FP8T_IMG_MX         /* MXFP8: 1x32 row blocks, E8M0 scales, E4M3 elements */
} fp8t_image_kind;

typedef struct {
    int kind;           /* fp8t_image_kind */
    fp8_format fmt;     /* element format (MX: always E4M3) */
    int tile_r, tile_c; /* FP8T_IMG_TILES */
    const float *scale; /* FP8T_IMG_SCALE: device pointer to the scale (value = x * scale) */
    float epsilon;      /* FP8T_IMG_CURRENT: fp8t_current_scale's epsilon (TILES: 0) */
    int pow2;           /* CURRENT and TILES: fp8t_current_scale's pow2 */
} fp8t_image_spec;

typedef struct {
    int n_images; /* <= FP8T_STATS_MAX_IMAGES; 0: moments of x only */
    fp8t_image_spec img[FP8T_STATS_MAX_IMAGES];
    /* block > 0: per-block statistics of `block` consecutive elements (last partial) under
     * the per-tensor scale of image block_img (a SCALE or CURRENT image), summarized in the
     * raw struct; block_list (device memory, n_blocks entries, may be NULL) gets every block */
    int block, block_img;
    struct fp8t_block_raw *block_list;
    /* tile_stats (image 0 a TILES image: the block / rowwise GEMMs' own image): each of its
     * tiles' error on its own, summarized in the raw struct (the worst tile's SQNR and
     * underflow; a block-scaled tensor's error hides in its worst tiles) */
    int tile_stats;
    /* the row stride of x in elements: 0 (or cols) for a packed [rows, cols] tensor, more for
     * rows in a wider buffer (the model's head logits, rows padded to pad(V)); the elements
     * between cols and ld are not part of the tensor */
    int ld;
} fp8t_stats_req;

/* One block of a block=N request. */
typedef struct fp8t_block_raw {
    double amax, sqnr_db, underflow_pct;
} fp8t_block_raw;

/* The error of one image q of x, over the finite elements of x. */
typedef struct {
    uint64_t n_underflow;  /* x != 0 and q == 0 (the value flushed to zero) */
    uint64_t n_sat;        /* clipped: |x * s| rounds above the format max, so the saturating
                             cast changed it to +-max (fp8_encode(x*s, fmt, 0) overflows);
                             a value that rounds to the max itself is not counted */
    double err_sq, xq, qq; /* sum (q-x)^2, sum x q, sum q^2 */
    double scale;          /* the per-tensor scale used (SCALE, CURRENT); NaN for blocks */
} fp8t_image_raw;

typedef struct {
    uint64_t n, n_finite, n_nan, n_inf, n_zero;
    double min, max, amax;       /* over finite elements (+inf, -inf, 0 if none) */
    double min_nonzero;          /* smallest nonzero finite |x|; +inf if none */
    double sum, sum_abs, sum_sq; /* of finite x */
    double dev_sq;               /* sum (x - mean)^2 (second pass, mean = sum / n_finite) */
    int32_t n_images, block;
    fp8t_image_raw img[FP8T_STATS_MAX_IMAGES];
    /* block > 0 */
    uint64_t n_blocks, blocks_with_underflow, block_sqnr_min_index;
    double block_sqnr_min_db, block_amax_max, block_amax_min_nonzero, block_underflow_max_pct;
    /* tile_stats: over the tiles of image 0 (row-major tile index), each tile's SQNR and
     * underflow % (of its nonzero finite elements) as block=N's; the first tile of the lowest
     * SQNR and of the highest underflow. n_tiles 0: not computed. */
    uint64_t n_tiles, tiles_with_underflow, tile_sqnr_min_index, tile_underflow_max_index;
    double tile_sqnr_min_db, tile_underflow_max_pct;
} fp8t_stats_raw;

/* The reference: *out from host memory x (the CPU backend's tensor_stats; scale pointers of
 * SCALE images are host pointers here). Exactly the definitions of fp8t_fp8_stats, with
 * saturation counted as above. */
void fp8t_stats_raw_compute(fp8t_stats_raw *out, const float *x, int rows, int cols,
                            const fp8t_stats_req *req);
/* fp8t_stats of raw with the error fields of image `img` (img < 0 or >= n_images: moments
 * only, error fields 0); the same formulas as fp8t_fp8_stats. */
void fp8t_stats_from_raw(fp8t_stats *out, const fp8t_stats_raw *raw, int img);
/* underflow %, saturation % and SQNR (dB; 1e300 exact) of image img of raw */
void fp8t_image_summary(const fp8t_stats_raw *raw, int img, double *underflow_pct,
                        double *saturation_pct, double *sqnr_db);

#ifdef __cplusplus
}
#endif
#endif
