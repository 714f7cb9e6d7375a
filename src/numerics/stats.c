/* fp8train — statistics of a tensor and of its FP8 image (see stats.h, docs/numerics.md).
 *
 * Accuracy: every sum is in double with Neumaier (improved Kahan) compensation, and the
 * standard deviation takes a second pass over (x - mean)^2, so the results do not depend on
 * the magnitude of the mean. Determinism: the tensor is cut into fixed chunks of STATS_CHUNK
 * elements; threads fill one partial per chunk and the partials are combined in chunk order,
 * so the result is the same bits for any thread count.
 *
 * Definitions of the less obvious fields (all over finite elements of x unless said):
 *   underflow_pct  = 100 * #(x != 0 and q == 0) / #(x != 0)
 *   saturation_pct = 100 * #(x*scale rounds above fmt_max: clipped) / #finite (fp8 only)
 *   mse = sum (q-x)^2 / #finite, cosine = <x,q> / (|x| |q|) (1 if both zero, 0 if only one),
 *   sqnr_db = 10 log10(sum x^2 / sum (q-x)^2), 1e300 if the error is 0, -1e300 if x is 0 and
 *   the error is not. For compare_stats an element whose ref is non-finite is skipped; a
 *   non-finite test value where ref is finite propagates into mse/cosine/sqnr (never hidden). */
#include "fp8train/error.h"
#include "fp8train/stats.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATS_CHUNK 4096
#define STATS_OMP_MIN_N 65536
#define SQNR_EXACT 1e300

/* Neumaier compensated sum */
typedef struct {
    double s, c;
} ksum;

static inline void ksum_add(ksum *k, double v) {
    const double t = k->s + v;
    if (fabs(k->s) >= fabs(v))
        k->c += (k->s - t) + v;
    else
        k->c += (v - t) + k->s;
    k->s = t;
}

static inline double ksum_val(ksum k) { return k.s + k.c; }

/* Partial statistics of one chunk. */
typedef struct {
    size_t n_nan, n_inf, n_zero, n_finite, n_nonzero, n_underflow, n_sat;
    double min, max, amax, min_nonzero; /* min_nonzero: smallest nonzero |x|, INFINITY if none */
    ksum sum, sum_abs, sum_sq;          /* of x */
    ksum err_sq, xq, qq;                /* against q */
    ksum dev_sq;                        /* second pass: (x - mean)^2 */
} stats_acc;

static void acc_init(stats_acc *a) {
    memset(a, 0, sizeof *a);
    a->min = INFINITY, a->max = -INFINITY, a->min_nonzero = INFINITY;
}

/* What to compare x with: nothing, its FP8 image, or another tensor. */
typedef struct {
    enum { CMP_NONE, CMP_FP8, CMP_TENSOR } kind;
    const float *test; /* CMP_TENSOR: [n] */
    float scale;       /* CMP_FP8 */
    fp8_format fmt;    /* CMP_FP8 */
} stats_cmp;

/* First pass over x[0..len) (one chunk); `lo` is the chunk's offset into test. */
static void acc_chunk(stats_acc *a, const float *x, size_t lo, size_t len, const stats_cmp *cmp) {
    float qbuf[STATS_CHUNK]; /* [len] the FP8 image of this chunk */
    const float *q = NULL;
    if (cmp->kind == CMP_FP8) {
        fp8_fake_quantize(qbuf, x, len, cmp->scale, cmp->fmt);
        q = qbuf;
    } else if (cmp->kind == CMP_TENSOR) {
        q = cmp->test + lo;
    }
    for (size_t i = 0; i < len; i++) {
        const float xf = x[i];
        if (isnan(xf)) {
            a->n_nan++;
            continue;
        }
        if (isinf(xf)) {
            a->n_inf++;
            continue;
        }
        const double v = xf, av = fabs(v);
        a->n_finite++;
        if (v == 0.0) a->n_zero++;
        if (v < a->min) a->min = v;
        if (v > a->max) a->max = v;
        if (av > a->amax) a->amax = av;
        if (av > 0.0 && av < a->min_nonzero) a->min_nonzero = av;
        ksum_add(&a->sum, v);
        ksum_add(&a->sum_abs, av);
        ksum_add(&a->sum_sq, v * v); /* exact: a float square fits in a double */
        if (!q) continue;
        const double qv = q[i], d = qv - v;
        if (v != 0.0) {
            a->n_nonzero++;
            if (qv == 0.0) a->n_underflow++;
        }
        /* clipped: the cast without saturation overflows, i.e. |x*scale| rounds above the
         * format max; a value that rounds to the max (amax * (max/amax) a hair above max
         * in float) is represented, not clipped */
        if (cmp->kind == CMP_FP8 && fp8_overflows(xf * cmp->scale, cmp->fmt)) a->n_sat++;
        ksum_add(&a->err_sq, d * d);
        ksum_add(&a->xq, v * qv);
        ksum_add(&a->qq, qv * qv);
    }
}

static void acc_dev_chunk(stats_acc *a, const float *x, size_t len, double mean) {
    for (size_t i = 0; i < len; i++) {
        if (!isfinite(x[i])) continue;
        const double d = (double)x[i] - mean;
        ksum_add(&a->dev_sq, d * d);
    }
}

static void ksum_merge(ksum *into, ksum k) {
    ksum_add(into, k.s);
    ksum_add(into, k.c);
}

static void acc_merge(stats_acc *into, const stats_acc *a) {
    into->n_nan += a->n_nan, into->n_inf += a->n_inf, into->n_zero += a->n_zero;
    into->n_finite += a->n_finite, into->n_nonzero += a->n_nonzero;
    into->n_underflow += a->n_underflow, into->n_sat += a->n_sat;
    if (a->min < into->min) into->min = a->min;
    if (a->max > into->max) into->max = a->max;
    if (a->amax > into->amax) into->amax = a->amax;
    if (a->min_nonzero < into->min_nonzero) into->min_nonzero = a->min_nonzero;
    ksum_merge(&into->sum, a->sum), ksum_merge(&into->sum_abs, a->sum_abs);
    ksum_merge(&into->sum_sq, a->sum_sq), ksum_merge(&into->err_sq, a->err_sq);
    ksum_merge(&into->xq, a->xq), ksum_merge(&into->qq, a->qq);
    ksum_merge(&into->dev_sq, a->dev_sq);
}

/* The whole computation: two chunked passes, combined in chunk order. */
static void stats_run(fp8t_stats *out, const float *x, size_t n, const stats_cmp *cmp) {
    const size_t nchunks = (n + STATS_CHUNK - 1) / STATS_CHUNK;
    stats_acc total;
    acc_init(&total);
    stats_acc *parts = nchunks > 1 ? malloc(nchunks * sizeof *parts) : NULL; /* [nchunks] */
    if (nchunks > 1 && !parts) fp8t_warnf("fp8t stats: out of memory, running on one thread");

    if (parts) {
#pragma omp parallel for schedule(static) if (n >= STATS_OMP_MIN_N)
        for (size_t ch = 0; ch < nchunks; ch++) {
            const size_t lo = ch * STATS_CHUNK, len = n - lo < STATS_CHUNK ? n - lo : STATS_CHUNK;
            acc_init(&parts[ch]);
            acc_chunk(&parts[ch], x + lo, lo, len, cmp);
        }
        for (size_t ch = 0; ch < nchunks; ch++) acc_merge(&total, &parts[ch]);
    } else {
        for (size_t lo = 0; lo < n; lo += STATS_CHUNK) {
            stats_acc a;
            acc_init(&a);
            acc_chunk(&a, x + lo, lo, n - lo < STATS_CHUNK ? n - lo : STATS_CHUNK, cmp);
            acc_merge(&total, &a);
        }
    }

    const double nf = (double)total.n_finite;
    const double mean = total.n_finite ? ksum_val(total.sum) / nf : 0.0;

    ksum dev = {0, 0};
    if (parts) {
#pragma omp parallel for schedule(static) if (n >= STATS_OMP_MIN_N)
        for (size_t ch = 0; ch < nchunks; ch++) {
            const size_t lo = ch * STATS_CHUNK, len = n - lo < STATS_CHUNK ? n - lo : STATS_CHUNK;
            parts[ch].dev_sq = (ksum){0, 0};
            acc_dev_chunk(&parts[ch], x + lo, len, mean);
        }
        for (size_t ch = 0; ch < nchunks; ch++) ksum_merge(&dev, parts[ch].dev_sq);
    } else {
        stats_acc a;
        acc_init(&a);
        acc_dev_chunk(&a, x, n, mean);
        dev = a.dev_sq;
    }
    free(parts);

    memset(out, 0, sizeof *out);
    out->n = n;
    out->n_nan = total.n_nan, out->n_inf = total.n_inf, out->n_zero = total.n_zero;
    if (total.n_finite) {
        out->min = total.min, out->max = total.max, out->mean = mean;
        out->std = sqrt(ksum_val(dev) / nf);
    }
    out->l1 = ksum_val(total.sum_abs);
    const double xx = ksum_val(total.sum_sq);
    out->l2 = sqrt(xx);
    out->amax = total.amax;
    out->dynamic_range =
        total.min_nonzero < INFINITY ? log2(total.amax) - log2(total.min_nonzero) : 0.0;
    if (cmp->kind == CMP_NONE) return;

    if (total.n_nonzero)
        out->underflow_pct = 100.0 * (double)total.n_underflow / (double)total.n_nonzero;
    if (cmp->kind == CMP_FP8 && total.n_finite)
        out->saturation_pct = 100.0 * (double)total.n_sat / nf;
    const double err = ksum_val(total.err_sq), xq = ksum_val(total.xq), qq = ksum_val(total.qq);
    out->mse = total.n_finite ? err / nf : 0.0;
    if (xx == 0.0 && qq == 0.0)
        out->cosine = 1.0;
    else if (xx == 0.0 || qq == 0.0)
        out->cosine = 0.0;
    else
        out->cosine = xq / (sqrt(xx) * sqrt(qq));
    if (err == 0.0)
        out->sqnr_db = SQNR_EXACT;
    else if (xx == 0.0)
        out->sqnr_db = -SQNR_EXACT;
    else
        out->sqnr_db = 10.0 * log10(xx / err);
}

void fp8t_tensor_stats(fp8t_stats *out, const float *x, size_t n) {
    const stats_cmp cmp = {.kind = CMP_NONE};
    stats_run(out, x, n, &cmp);
}

void fp8t_fp8_stats(fp8t_stats *out, const float *x, size_t n, float scale, fp8_format fmt) {
    const stats_cmp cmp = {.kind = CMP_FP8, .scale = scale, .fmt = fmt};
    stats_run(out, x, n, &cmp);
}

void fp8t_compare_stats(fp8t_stats *out, const float *ref, const float *test, size_t n) {
    const stats_cmp cmp = {.kind = CMP_TENSOR, .test = test};
    stats_run(out, ref, n, &cmp);
}

void fp8t_block_fp8_stats(fp8t_stats *out, const float *x, size_t n, size_t block, float scale,
                          fp8_format fmt) {
    if (block == 0) {
        fp8t_warnf("fp8t_block_fp8_stats: block size 0 (need block >= 1, e.g. 128)");
        return;
    }
    const size_t nb = (n + block - 1) / block;
    const stats_cmp cmp = {.kind = CMP_FP8, .scale = scale, .fmt = fmt};
    /* blocks are independent: one thread per block range, each block single-threaded */
#pragma omp parallel for schedule(static) if (n >= STATS_OMP_MIN_N && nb > 1)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * block;
        stats_run(&out[b], x + lo, n - lo < block ? n - lo : block, &cmp);
    }
}
