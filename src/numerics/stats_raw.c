/* fp8train — raw tensor statistics (stats.h: fp8t_stats_raw): the reference the backend op
 * tensor_stats is checked against, and the host-side finish (fp8t_stats_from_raw).
 *
 * The images are built with the library's own quantizers (fp8_fake_quantize,
 * fp8t_block_quantize / _dequantize, fp8t_mxfp8_quantize / _dequantize), so the reference is
 * the recipe definitions themselves, not a second copy of them. Sums are in double with
 * Neumaier compensation, in element order (the images on separate threads, each one
 * sequential: the same bits for any thread count). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/error.h"
#include "fp8train/recipe.h"
#include "fp8train/stats.h"
#include "util/check.h"

#define SQNR_EXACT 1e300
#define MX_BLOCK 32

int fp8_overflows(float v, fp8_format fmt) {
    if (isnan(v)) return 0;
    const unsigned code = fp8_encode(v, fmt, 0) & 0x7Fu;
    return code == (fmt == FP8_E5M2 ? 0x7Cu : 0x7Fu);
}

typedef struct {
    double s, c;
} nsum; /* Neumaier compensated sum */

static void nsum_add(nsum *k, double v) {
    const double t = k->s + v;
    if (fabs(k->s) >= fabs(v))
        k->c += (k->s - t) + v;
    else
        k->c += (v - t) + k->s;
    k->s = t;
}

static double nsum_val(nsum k) { return k.s + k.c; }

static double sqnr_of(double xx, double err) {
    if (err == 0.0) return SQNR_EXACT;
    if (xx == 0.0) return -SQNR_EXACT;
    return 10.0 * log10(xx / err);
}

/* The image q[n] of x under spec, and the per-element scale (for the clipping test) through
 * scales/e8m0 (block kinds) or *tensor_scale. 0 ok, -1 out of memory. */
typedef struct {
    float *q;
    uint8_t *codes;
    float *bscales; /* TILES: per-block scale */
    uint8_t *e8m0;  /* MX: per-block biased exponent */
    float tensor_scale;
} image_buf;

static float elem_scale(const image_buf *ib, const fp8t_image_spec *sp, int r, int c, int cols) {
    if (sp->kind == FP8T_IMG_TILES) {
        const int nbc = (cols + sp->tile_c - 1) / sp->tile_c;
        return ib->bscales[(size_t)(r / sp->tile_r) * (size_t)nbc + (size_t)(c / sp->tile_c)];
    }
    if (sp->kind == FP8T_IMG_MX) {
        const int nb = (cols + MX_BLOCK - 1) / MX_BLOCK;
        const int eb = ib->e8m0[(size_t)r * (size_t)nb + (size_t)(c / MX_BLOCK)];
        return eb == 0xFF ? NAN : ldexpf(1.0f, 127 - eb); /* x * 2^-e */
    }
    return ib->tensor_scale;
}

static int make_image(image_buf *ib, const float *x, int rows, int cols,
                      const fp8t_image_spec *sp, float amax) {
    const size_t n = (size_t)rows * (size_t)cols;
    ib->q = malloc(n * sizeof(float));
    ib->codes = malloc(n);
    if (!ib->q || !ib->codes) return -1;
    ib->tensor_scale = NAN;
    if (sp->kind == FP8T_IMG_TILES) {
        const size_t nb = (size_t)((rows + sp->tile_r - 1) / sp->tile_r) *
                          (size_t)((cols + sp->tile_c - 1) / sp->tile_c);
        ib->bscales = malloc(nb * sizeof(float));
        if (!ib->bscales) return -1;
        fp8t_block_quantize_pow2(ib->codes, ib->bscales, x, rows, cols, sp->tile_r, sp->tile_c,
                                 sp->fmt, sp->pow2);
        fp8t_block_dequantize(ib->q, ib->codes, ib->bscales, rows, cols, sp->tile_r, sp->tile_c,
                              sp->fmt);
    } else if (sp->kind == FP8T_IMG_MX) {
        ib->e8m0 = malloc((size_t)rows * (size_t)((cols + MX_BLOCK - 1) / MX_BLOCK));
        if (!ib->e8m0) return -1;
        fp8t_mxfp8_quantize(ib->codes, ib->e8m0, x, rows, cols);
        fp8t_mxfp8_dequantize(ib->q, ib->codes, ib->e8m0, rows, cols);
    } else {
        ib->tensor_scale =
            sp->kind == FP8T_IMG_SCALE
                ? *sp->scale
                : fp8t_current_scale(amax, fp8_format_max(sp->fmt), sp->epsilon, sp->pow2);
        fp8_fake_quantize(ib->q, x, n, ib->tensor_scale, sp->fmt);
    }
    return 0;
}

static void free_image(image_buf *ib) {
    free(ib->q);
    free(ib->codes);
    free(ib->bscales);
    free(ib->e8m0);
    memset(ib, 0, sizeof *ib);
}

/* Per-block statistics of `block` consecutive elements of x at a per-tensor scale. */
static void block_summary(fp8t_stats_raw *out, const float *x, size_t n, int block, float scale,
                          fp8_format fmt, fp8t_block_raw *list) {
    const size_t bs = (size_t)block, nb = (n + bs - 1) / bs;
    out->n_blocks = nb;
    out->block_sqnr_min_db = INFINITY;
    out->block_amax_min_nonzero = INFINITY;
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * bs, hi = lo + bs < n ? lo + bs : n;
        double amax = 0;
        nsum xx = {0, 0}, err = {0, 0};
        uint64_t nonzero = 0, under = 0;
        for (size_t i = lo; i < hi; i++) {
            const float xf = x[i];
            if (!isfinite(xf)) continue;
            const float qf = fp8_decode(fp8_encode(xf * scale, fmt, 1), fmt) / scale;
            const double v = xf, d = (double)qf - v;
            if (fabs(v) > amax) amax = fabs(v);
            nsum_add(&xx, v * v);
            nsum_add(&err, d * d);
            if (v != 0.0) {
                nonzero++;
                under += qf == 0.0f;
            }
        }
        const double sq = sqnr_of(nsum_val(xx), nsum_val(err));
        const double up = nonzero ? 100.0 * (double)under / (double)nonzero : 0.0;
        if (list) list[b] = (fp8t_block_raw){.amax = amax, .sqnr_db = sq, .underflow_pct = up};
        if (sq < out->block_sqnr_min_db) {
            out->block_sqnr_min_db = sq;
            out->block_sqnr_min_index = b;
        }
        if (amax > out->block_amax_max) out->block_amax_max = amax;
        if (amax > 0 && amax < out->block_amax_min_nonzero) out->block_amax_min_nonzero = amax;
        if (under) out->blocks_with_underflow++;
        if (up > out->block_underflow_max_pct) out->block_underflow_max_pct = up;
    }
}

/* Each tile of a TILES image q of x on its own (tile_stats): SQNR and underflow %, as
 * block_summary's per block, summarized into out. */
static void tile_summary(fp8t_stats_raw *out, const float *x, const float *q, int rows, int cols,
                         int tr, int tc) {
    const int nbr = (rows + tr - 1) / tr, nbc = (cols + tc - 1) / tc;
    out->n_tiles = (uint64_t)nbr * (uint64_t)nbc;
    out->tile_sqnr_min_db = INFINITY;
    out->tile_underflow_max_pct = -1.0;
    for (uint64_t t = 0; t < out->n_tiles; t++) {
        const int r0 = (int)(t / (uint64_t)nbc) * tr, c0 = (int)(t % (uint64_t)nbc) * tc;
        const int r1 = r0 + tr < rows ? r0 + tr : rows, c1 = c0 + tc < cols ? c0 + tc : cols;
        nsum xx = {0, 0}, err = {0, 0};
        uint64_t nonzero = 0, under = 0;
        for (int r = r0; r < r1; r++)
            for (int c = c0; c < c1; c++) {
                const size_t i = (size_t)r * (size_t)cols + (size_t)c;
                if (!isfinite(x[i])) continue;
                const double v = x[i], d = (double)q[i] - v;
                nsum_add(&xx, v * v);
                nsum_add(&err, d * d);
                if (v != 0.0) {
                    nonzero++;
                    under += q[i] == 0.0f;
                }
            }
        const double sq = sqnr_of(nsum_val(xx), nsum_val(err));
        const double up = nonzero ? 100.0 * (double)under / (double)nonzero : 0.0;
        if (sq < out->tile_sqnr_min_db) {
            out->tile_sqnr_min_db = sq;
            out->tile_sqnr_min_index = t;
        }
        if (up > out->tile_underflow_max_pct) {
            out->tile_underflow_max_pct = up;
            out->tile_underflow_max_index = t;
        }
        if (under) out->tiles_with_underflow++;
    }
}

void fp8t_stats_raw_compute(fp8t_stats_raw *out, const float *x, int rows, int cols,
                            const fp8t_stats_req *req) {
    if (req && req->ld != 0 && req->ld < cols) {
        FP8T_FATAL("tensor_stats: row stride %d is less than the %d columns", req->ld, cols);
    }
    if (req && req->ld > cols && rows > 0 && cols > 0) {
        /* rows in a wider buffer: the reference reads them packed (the same elements in the
         * same order, so the same result as the packed tensor's) */
        float *p = malloc((size_t)rows * (size_t)cols * sizeof(float));
        if (!p) {
            FP8T_FATAL("tensor_stats: out of memory packing a %dx%d tensor of row stride %d",
                       rows, cols, req->ld);
        }
        for (int r = 0; r < rows; r++)
            memcpy(p + (size_t)r * cols, x + (size_t)r * req->ld, (size_t)cols * sizeof(float));
        fp8t_stats_req packed = *req;
        packed.ld = 0;
        fp8t_stats_raw_compute(out, p, rows, cols, &packed);
        free(p);
        return;
    }
    memset(out, 0, sizeof *out);
    const size_t n = rows > 0 && cols > 0 ? (size_t)rows * (size_t)cols : 0;
    out->n = n;
    out->min = INFINITY, out->max = -INFINITY, out->min_nonzero = INFINITY;
    nsum sum = {0, 0}, sabs = {0, 0}, ssq = {0, 0}, dev = {0, 0};
    for (size_t i = 0; i < n; i++) {
        const float xf = x[i];
        if (isnan(xf)) {
            out->n_nan++;
            continue;
        }
        if (isinf(xf)) {
            out->n_inf++;
            continue;
        }
        const double v = xf, av = fabs(v);
        out->n_finite++;
        if (v == 0.0) out->n_zero++;
        if (v < out->min) out->min = v;
        if (v > out->max) out->max = v;
        if (av > out->amax) out->amax = av;
        if (av > 0.0 && av < out->min_nonzero) out->min_nonzero = av;
        nsum_add(&sum, v);
        nsum_add(&sabs, av);
        nsum_add(&ssq, v * v);
    }
    out->sum = nsum_val(sum), out->sum_abs = nsum_val(sabs), out->sum_sq = nsum_val(ssq);
    const double mean = out->n_finite ? out->sum / (double)out->n_finite : 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) continue;
        const double d = (double)x[i] - mean;
        nsum_add(&dev, d * d);
    }
    out->dev_sq = nsum_val(dev);
    if (!req || n == 0) return;

    /* amax as the quantizers see it (NaN wins, Inf counts): the current-scaling input */
    const float qamax = fp8_amax(x, n);
    const int ni = req->n_images < FP8T_STATS_MAX_IMAGES ? req->n_images : FP8T_STATS_MAX_IMAGES;
    out->n_images = ni > 0 ? ni : 0;
    /* images are independent and each one's sums run in element order: one thread per image
     * changes no bit */
#pragma omp parallel for schedule(dynamic, 1) if (n >= 65536 && out->n_images > 1)
    for (int k = 0; k < out->n_images; k++) {
        const fp8t_image_spec *sp = &req->img[k];
        fp8t_image_raw *ir = &out->img[k];
        image_buf ib = {0};
        if (make_image(&ib, x, rows, cols, sp, qamax)) {
            fp8t_warnf("fp8t_stats_raw_compute: out of memory for a %dx%d image", rows, cols);
            free_image(&ib);
            ir->err_sq = ir->xq = ir->qq = ir->scale = NAN;
            continue;
        }
        ir->scale = sp->kind == FP8T_IMG_SCALE || sp->kind == FP8T_IMG_CURRENT
                        ? (double)ib.tensor_scale
                        : NAN;
        const fp8_format efmt = sp->kind == FP8T_IMG_MX ? FP8_E4M3 : sp->fmt;
        nsum err = {0, 0}, xq = {0, 0}, qq = {0, 0};
        for (size_t i = 0; i < n; i++) {
            const float xf = x[i];
            if (!isfinite(xf)) continue;
            const double v = xf, qv = ib.q[i], d = qv - v;
            if (v != 0.0 && qv == 0.0) ir->n_underflow++;
            const float s =
                elem_scale(&ib, sp, (int)(i / (size_t)cols), (int)(i % (size_t)cols), cols);
            ir->n_sat += (uint64_t)fp8_overflows(xf * s, efmt);
            nsum_add(&err, d * d);
            nsum_add(&xq, v * qv);
            nsum_add(&qq, qv * qv);
        }
        ir->err_sq = nsum_val(err), ir->xq = nsum_val(xq), ir->qq = nsum_val(qq);
        if (k == 0 && req->tile_stats && sp->kind == FP8T_IMG_TILES)
            tile_summary(out, x, ib.q, rows, cols, sp->tile_r, sp->tile_c);
        free_image(&ib);
    }
    if (req->block > 0 && req->block_img >= 0 && req->block_img < out->n_images &&
        (req->img[req->block_img].kind == FP8T_IMG_SCALE ||
         req->img[req->block_img].kind == FP8T_IMG_CURRENT)) {
        out->block = req->block;
        block_summary(out, x, n, req->block, (float)out->img[req->block_img].scale,
                      req->img[req->block_img].fmt, req->block_list);
    }
}

void fp8t_stats_from_raw(fp8t_stats *out, const fp8t_stats_raw *raw, int img) {
    memset(out, 0, sizeof *out);
    out->n = (size_t)raw->n;
    out->n_nan = (size_t)raw->n_nan, out->n_inf = (size_t)raw->n_inf;
    out->n_zero = (size_t)raw->n_zero;
    const double nf = (double)raw->n_finite;
    if (raw->n_finite) {
        out->min = raw->min, out->max = raw->max;
        out->mean = raw->sum / nf;
        out->std = sqrt(raw->dev_sq / nf);
    }
    out->l1 = raw->sum_abs;
    out->l2 = sqrt(raw->sum_sq);
    out->amax = raw->amax;
    out->dynamic_range =
        raw->min_nonzero < INFINITY ? log2(raw->amax) - log2(raw->min_nonzero) : 0.0;
    if (img < 0 || img >= raw->n_images) return;
    const fp8t_image_raw *ir = &raw->img[img];
    const uint64_t nonzero = raw->n_finite - raw->n_zero;
    if (nonzero) out->underflow_pct = 100.0 * (double)ir->n_underflow / (double)nonzero;
    if (raw->n_finite) out->saturation_pct = 100.0 * (double)ir->n_sat / nf;
    const double xx = raw->sum_sq;
    out->mse = raw->n_finite ? ir->err_sq / nf : 0.0;
    if (xx == 0.0 && ir->qq == 0.0)
        out->cosine = 1.0;
    else if (xx == 0.0 || ir->qq == 0.0)
        out->cosine = 0.0;
    else
        out->cosine = ir->xq / (sqrt(xx) * sqrt(ir->qq));
    out->sqnr_db = sqnr_of(xx, ir->err_sq);
}

void fp8t_image_summary(const fp8t_stats_raw *raw, int img, double *underflow_pct,
                        double *saturation_pct, double *sqnr_db) {
    fp8t_stats st;
    fp8t_stats_from_raw(&st, raw, img);
    *underflow_pct = st.underflow_pct;
    *saturation_pct = st.saturation_pct;
    *sqnr_db = st.sqnr_db;
}
