/* fp8train — tensor statistics against a straightforward double-precision loop written here,
 * plus hand-worked small cases, self-cosine, per-block stats and non-finite counting. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/recipe.h"
#include "fp8train/stats.h"
#include "numerics/fp8_round_hd.h"
#include "test.h"

#define RTOL 1e-10

/* ---- the straightforward reference ---- */
typedef struct {
    size_t n_nan, n_inf, n_zero, n_fin, n_nz, n_under, n_sat;
    double min, max, mean, std, l1, l2, amax, minnz, mse, cosine, sqnr;
} ref_stats;

/* A value is clipped when it rounds above the format max, i.e. past the midpoint between the
 * max and the next value the format would have with more exponent range; a tie goes to the
 * even mantissa. E4M3: 448 = 1.110b * 2^8, next 480, the tie 464 goes to 448 (kept), so
 * clipped iff |v| > 464. E5M2: 57344 = 1.11b * 2^15, next 2^16, the tie 61440 goes to 2^16
 * (clipped), so clipped iff |v| >= 61440. */
static int clipped(float v, float fmt_max) {
    return fmt_max == 448.0f ? fabsf(v) > 464.0f : fabsf(v) >= 61440.0f;
}

/* q == NULL: x alone. Otherwise q is the image; sat_scale > 0 counts saturation. */
static ref_stats reference(const float *x, const float *q, size_t n, float sat_scale,
                           float fmt_max) {
    ref_stats r;
    memset(&r, 0, sizeof r);
    r.min = INFINITY, r.max = -INFINITY, r.minnz = INFINITY;
    double sum = 0, sxx = 0, sqq = 0, sxq = 0, see = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i])) {
            r.n_nan++;
            continue;
        }
        if (isinf(x[i])) {
            r.n_inf++;
            continue;
        }
        const double v = x[i];
        r.n_fin++;
        r.n_zero += v == 0;
        r.min = fmin(r.min, v), r.max = fmax(r.max, v), r.amax = fmax(r.amax, fabs(v));
        if (v != 0) r.minnz = fmin(r.minnz, fabs(v));
        sum += v, r.l1 += fabs(v), sxx += v * v;
        if (q) {
            const double w = q[i];
            if (v != 0) r.n_nz++, r.n_under += w == 0;
            if (sat_scale > 0 && clipped(x[i] * sat_scale, fmt_max)) r.n_sat++;
            see += (w - v) * (w - v), sxq += v * w, sqq += w * w;
        }
    }
    r.mean = r.n_fin ? sum / (double)r.n_fin : 0;
    double dev = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i])) dev += ((double)x[i] - r.mean) * ((double)x[i] - r.mean);
    r.std = r.n_fin ? sqrt(dev / (double)r.n_fin) : 0;
    r.l2 = sqrt(sxx);
    r.mse = r.n_fin ? see / (double)r.n_fin : 0;
    r.cosine = sxx == 0 && sqq == 0 ? 1 : sxq / sqrt(sxx * sqq);
    r.sqnr = see == 0 ? 1e300 : 10 * log10(sxx / see);
    return r;
}

static void check_against_reference(const fp8t_stats *s, const ref_stats *r, size_t n,
                                    int with_q) {
    T_CHECK(s->n == n && s->n_nan == r->n_nan && s->n_inf == r->n_inf && s->n_zero == r->n_zero,
            "counts n=%zu nan=%zu inf=%zu zero=%zu vs %zu %zu %zu", s->n, s->n_nan, s->n_inf,
            s->n_zero, r->n_nan, r->n_inf, r->n_zero);
    T_CHECK(s->min == r->min && s->max == r->max && s->amax == r->amax, "min/max/amax");
    T_CLOSE(s->mean, r->mean, 1e-300, RTOL);
    T_CLOSE(s->std, r->std, 1e-300, RTOL);
    T_CLOSE(s->l1, r->l1, 0, RTOL);
    T_CLOSE(s->l2, r->l2, 0, RTOL);
    T_CLOSE(s->dynamic_range, log2(r->amax) - log2(r->minnz), 1e-12, 0);
    if (!with_q) {
        T_CHECK(s->mse == 0 && s->cosine == 0 && s->sqnr_db == 0 && s->underflow_pct == 0 &&
                    s->saturation_pct == 0,
                "comparison fields stay 0 without a comparison");
        return;
    }
    T_CLOSE(s->underflow_pct, 100.0 * (double)r->n_under / (double)r->n_nz, 1e-12, 0);
    T_CLOSE(s->mse, r->mse, 0, RTOL);
    T_CLOSE(s->cosine, r->cosine, 1e-12, 0);
    T_CLOSE(s->sqnr_db, r->sqnr, 1e-9, 0);
}

/* ---- data ---- */
static uint64_t rng = 0x2545F4914F6CDD1Dull;
static double uniform(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
/* magnitudes from 2^-30 to 2^12 so that FP8 both underflows and saturates */
static void fill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const double m = 1 + uniform(), e = floor(uniform() * 42) - 30;
        x[i] = (float)(ldexp(m, (int)e) * (uniform() < 0.5 ? -1 : 1));
        if (i % 101 == 3) x[i] = 0;
    }
}

/* {1, -2, 3, NaN, Inf, 0}: finite 1, -2, 3, 0 -> mean 0.5; deviations .5 -2.5 2.5 -.5,
 * squares sum 13 -> std sqrt(13/4); l1 6; l2 sqrt(14); amax 3; range log2(3/1). */
static void test_hand_small(void) {
    const float x[6] = {1, -2, 3, NAN, INFINITY, 0};
    fp8t_stats s;
    fp8t_tensor_stats(&s, x, 6);
    T_CHECK(s.n == 6 && s.n_nan == 1 && s.n_inf == 1 && s.n_zero == 1, "counts");
    T_CHECK(s.min == -2 && s.max == 3 && s.mean == 0.5 && s.amax == 3, "min max mean amax");
    T_CLOSE(s.std, sqrt(3.25), 0, 1e-15);
    T_CHECK(s.l1 == 6, "l1 %g", s.l1);
    T_CLOSE(s.l2, sqrt(14.0), 0, 1e-15);
    T_CLOSE(s.dynamic_range, log2(3.0), 1e-15, 0);
    /* FP8 image at scale 1 in E4M3: 1, -2, 3 and 0 are exact -> error 0 */
    fp8t_fp8_stats(&s, x, 6, 1.0f, FP8_E4M3);
    T_CHECK(s.mse == 0 && s.cosine == 1 && s.sqnr_db == 1e300 && s.underflow_pct == 0 &&
                s.saturation_pct == 0,
            "exact image: mse %g cos %g sqnr %g", s.mse, s.cosine, s.sqnr_db);
    /* scale 200: 3*200 = 600 > 448 saturates (1 of 4 finite = 25%) -> image 448/200 = 2.24;
     * 1*200 = 200 is the midpoint of 192 (m=4) and 208 (m=5) -> 192 -> image 0.96;
     * -2*200 = -400 is the midpoint of -384 (m=4) and -416 -> -384 -> image -1.92. */
    fp8t_fp8_stats(&s, x, 6, 200.0f, FP8_E4M3);
    T_CLOSE(s.saturation_pct, 25.0, 1e-12, 0);
    const double e1 = 0.96f - 1.0, e2 = -1.92f + 2.0, e3 = 2.24f - 3.0;
    T_CLOSE(s.mse, (e1 * e1 + e2 * e2 + e3 * e3) / 4, 0, 1e-7);
}

static void test_tensor_stats_vs_reference(void) {
    const size_t n = 250001; /* several chunks, threaded, partial last chunk */
    float *x = malloc(n * sizeof *x);
    T_ASSERT(x, "out of memory");
    fill(x, n);
    x[17] = NAN, x[40000] = -INFINITY, x[n - 1] = INFINITY, x[123456] = NAN;
    fp8t_stats s;
    fp8t_tensor_stats(&s, x, n);
    const ref_stats r = reference(x, NULL, n, 0, 0);
    check_against_reference(&s, &r, n, 0);
    T_CHECK(s.n_nan == 2 && s.n_inf == 2, "non-finite counted: nan %zu inf %zu", s.n_nan,
            s.n_inf);
    free(x);
}

static void test_fp8_stats_vs_reference(void) {
    const size_t n = 100003;
    float *x = malloc(n * sizeof *x), *q = malloc(n * sizeof *q);
    T_ASSERT(x && q, "out of memory");
    fill(x, n);
    x[99] = NAN;
    const float scales[2] = {0.25f, 64.0f};
    for (int fm = 0; fm < 2; fm++)
        for (int k = 0; k < 2; k++) {
            const float sc = scales[k];
            for (size_t i = 0; i < n; i++)
                q[i] = fp8_decode(fp8_encode(x[i] * sc, (fp8_format)fm, 1), (fp8_format)fm) / sc;
            fp8t_stats s;
            fp8t_fp8_stats(&s, x, n, sc, (fp8_format)fm);
            const ref_stats r = reference(x, q, n, sc, fp8_format_max((fp8_format)fm));
            check_against_reference(&s, &r, n, 1);
            T_CLOSE(s.saturation_pct, 100.0 * (double)r.n_sat / (double)r.n_fin, 1e-12, 0);
            /* the data reach 2^13: only E5M2 at scale 0.25 stays below its max */
            const int can_saturate = fm == FP8_E4M3 || k == 1;
            T_CHECK((r.n_sat > 0) == can_saturate && r.n_under > 0,
                    "the data must exercise both (sat %zu under %zu)", r.n_sat, r.n_under);
        }
    free(x), free(q);
}

static void test_compare_and_self_cosine(void) {
    const size_t n = 1000000;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    T_ASSERT(x && y, "out of memory");
    fill(x, n);
    fp8t_stats s;
    fp8t_compare_stats(&s, x, x, n);
    T_CHECK(fabs(s.cosine - 1.0) <= 1e-12, "cos(x, x) = %.17g", s.cosine);
    T_CHECK(s.mse == 0 && s.sqnr_db == 1e300 && s.underflow_pct == 0, "x vs x is exact");
    for (size_t i = 0; i < n; i++) y[i] = x[i] * (1.0f + (float)((i % 7) - 3) * 1e-3f);
    fp8t_compare_stats(&s, x, y, n);
    const ref_stats r = reference(x, y, n, 0, 0);
    check_against_reference(&s, &r, n, 1);
    T_CHECK(s.saturation_pct == 0, "no saturation in a plain comparison");
    /* orthogonal and opposite */
    const float a[2] = {1, 0}, b[2] = {0, 1}, c[2] = {-1, 0}, z[2] = {0, 0};
    fp8t_compare_stats(&s, a, b, 2);
    T_CHECK(s.cosine == 0 && s.mse == 1 && s.sqnr_db == 10 * log10(0.5), "orthogonal");
    fp8t_compare_stats(&s, a, c, 2);
    T_CHECK(s.cosine == -1 && s.mse == 2, "opposite");
    fp8t_compare_stats(&s, z, z, 2);
    T_CHECK(s.cosine == 1 && s.sqnr_db == 1e300 && s.dynamic_range == 0, "all zero");
    fp8t_compare_stats(&s, a, z, 2);
    T_CHECK(s.cosine == 0 && s.underflow_pct == 100, "image all zero");
    free(x), free(y);
}

static void test_block_stats(void) {
    const size_t n = 1000, block = 128, nb = 8; /* last block 104 */
    float x[1000];
    fill(x, n);
    x[130] = NAN, x[999] = INFINITY;
    fp8t_stats bs[8];
    fp8t_block_fp8_stats(bs, x, n, block, 64.0f, FP8_E4M3);
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * block, len = n - lo < block ? n - lo : block;
        float q[128];
        for (size_t i = 0; i < len; i++)
            q[i] = fp8_decode(fp8_encode(x[lo + i] * 64.0f, FP8_E4M3, 1), FP8_E4M3) / 64.0f;
        const ref_stats r = reference(x + lo, q, len, 64.0f, 448.0f);
        check_against_reference(&bs[b], &r, len, 1);
        T_CLOSE(bs[b].saturation_pct, 100.0 * (double)r.n_sat / (double)r.n_fin, 1e-12, 0);
    }
    T_CHECK(bs[1].n_nan == 1 && bs[7].n_inf == 1 && bs[7].n == 104, "per-block counts");
}

static void test_precision_large_offset(void) {
    /* mean 1e4 with spread ~1e-3: a one-pass sum-of-squares std would lose every digit */
    const size_t n = 200000;
    float *x = malloc(n * sizeof *x);
    T_ASSERT(x, "out of memory");
    for (size_t i = 0; i < n; i++) x[i] = 10000.0f + (float)((int)(i % 5) - 2) * 0.0009765625f;
    fp8t_stats s;
    fp8t_tensor_stats(&s, x, n);
    /* exactly: offsets -2..2 units of 2^-10, uniform: mean 1e4, var = 2 units^2 */
    T_CLOSE(s.mean, 10000.0, 0, 1e-15);
    T_CLOSE(s.std, sqrt(2.0) * 0.0009765625, 0, 1e-9);
    free(x);
}

static void test_deterministic_across_threads(void) {
    const size_t n = 300000;
    float *x = malloc(n * sizeof *x);
    T_ASSERT(x, "out of memory");
    fill(x, n);
    fp8t_stats a, b;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    fp8t_fp8_stats(&a, x, n, 2.0f, FP8_E5M2);
    omp_set_num_threads(2);
    fp8t_fp8_stats(&b, x, n, 2.0f, FP8_E5M2);
    omp_set_num_threads(saved);
    T_CHECK(!memcmp(&a, &b, sizeof a), "stats depend on the thread count");
    free(x);
}

static void test_empty(void) {
    fp8t_stats s;
    fp8t_tensor_stats(&s, NULL, 0);
    T_CHECK(s.n == 0 && s.mean == 0 && s.std == 0 && s.amax == 0 && s.dynamic_range == 0, "n=0");
    const float nan1[1] = {NAN};
    fp8t_tensor_stats(&s, nan1, 1);
    T_CHECK(s.n_nan == 1 && s.min == 0 && s.max == 0 && s.mean == 0, "no finite element");
}

/* Saturation counts what the cast clipped, not what lands on the max through rounding. */
static void test_saturation_is_clipping(void) {
    /* E4M3 at scale 1: 460 rounds to 448 (kept), 464 is the tie (to 448, kept), 465 and -500
     * round above (clipped), 448 exact: 2 of 5 */
    const float x[5] = {460, 464, 465, -500, 448};
    fp8t_stats s;
    fp8t_fp8_stats(&s, x, 5, 1.0f, FP8_E4M3);
    T_CHECK(s.saturation_pct == 40.0, "E4M3 clipped %% = %g, want 40", s.saturation_pct);
    /* E5M2: 61439 rounds to 57344 (kept); the tie 61440 goes to the even 2^16 (clipped) */
    const float y[4] = {59392, 61439, 61440, 70000};
    fp8t_fp8_stats(&s, y, 4, 1.0f, FP8_E5M2);
    T_CHECK(s.saturation_pct == 50.0, "E5M2 clipped %% = %g, want 50", s.saturation_pct);
    /* current scaling: amax * (448 / amax) can exceed 448 in float; that element is the max
     * itself, not clipped. Find such an amax, then check nothing is counted. */
    float amax = 1.0f;
    int found = 0;
    for (int i = 0; i < 100000 && !found; i++) {
        amax = 1.0f + (float)i * 1.1920929e-7f * 7.0f;
        const float sc = 448.0f / amax;
        if (amax * sc > 448.0f) found = 1;
    }
    T_ASSERT(found, "no amax with amax * (448/amax) > 448 in the search");
    const float z[3] = {amax, -amax, amax / 3};
    fp8t_fp8_stats(&s, z, 3, 448.0f / amax, FP8_E4M3);
    T_CHECK(s.saturation_pct == 0, "rounding onto the max counted as clipped (amax %.9g)", amax);
    T_CHECK(fp8_overflows(amax * (448.0f / amax), FP8_E4M3) == 0 &&
                fp8_overflows(465, FP8_E4M3) && fp8_overflows(INFINITY, FP8_E5M2) &&
                !fp8_overflows(NAN, FP8_E4M3),
            "fp8_overflows");
    /* the thresholds (which the CUDA statistics compare against instead of casting) are
     * fp8_overflows on every float within 2^22 ulps of them, both signs; rounding is monotonic
     * in |v|, so beyond that band neither can change its answer */
    for (int f = 0; f < 2; f++) {
        const float t = f ? 61440.0f : 464.0f, fmax = f ? 57344.0f : 448.0f;
        uint32_t tb;
        memcpy(&tb, &t, sizeof tb);
        long bad = 0;
        for (uint32_t b = tb - (1u << 22); b <= tb + (1u << 22); b++)
            for (uint32_t sign = 0; sign < 2; sign++) {
                const uint32_t bits = b | sign << 31;
                float v;
                memcpy(&v, &bits, sizeof v);
                bad += clipped(v, fmax) != fp8_overflows(v, f ? FP8_E5M2 : FP8_E4M3);
            }
        T_CHECK(bad == 0, "%s: %ld floats near the threshold disagree", f ? "E5M2" : "E4M3", bad);
    }
}

/* clipped count of x against a per-element scale, by the threshold (independent of fp8.c) */
static uint64_t count_clipped(const float *x, size_t n, const float *sc, float fmt_max) {
    uint64_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i]) && clipped(x[i] * sc[i], fmt_max)) k++;
    return k;
}

static void check_image_vs_compare(const fp8t_stats_raw *raw, int img, const float *x,
                                   const float *q, size_t n, uint64_t want_sat,
                                   const char *what) {
    fp8t_stats a, b;
    fp8t_stats_from_raw(&a, raw, img);
    fp8t_compare_stats(&b, x, q, n);
    uint64_t nz = 0, under = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i]) && x[i] != 0) nz++, under += q[i] == 0;
    T_CHECK(raw->img[img].n_underflow == under, "%s: underflow %llu vs %llu", what,
            (unsigned long long)raw->img[img].n_underflow, (unsigned long long)under);
    T_CHECK(raw->img[img].n_sat == want_sat, "%s: clipped %llu vs %llu", what,
            (unsigned long long)raw->img[img].n_sat, (unsigned long long)want_sat);
    T_CLOSE(a.mse, b.mse, 0, 1e-12);
    T_CLOSE(a.cosine, b.cosine, 1e-14, 0);
    T_CLOSE(a.sqnr_db, b.sqnr_db, 1e-9, 0);
    T_CLOSE(a.underflow_pct, 100.0 * (double)under / (double)nz, 1e-12, 0);
}

/* The op's reference against the library's per-recipe functions, on every image kind. */
static void test_raw_images(void) {
    const int rows = 37, cols = 300;
    const size_t n = (size_t)rows * cols;
    float *x = malloc(n * sizeof *x), *q = malloc(n * sizeof *q), *sc = malloc(n * sizeof *sc);
    uint8_t *codes = malloc(n), *e8 = malloc((size_t)rows * 10);
    float *bscale = malloc(1024 * sizeof(float));
    T_ASSERT(x && q && sc && codes && e8 && bscale, "out of memory");
    fill(x, n);
    x[5] = NAN, x[700] = INFINITY, x[2000] = -INFINITY;
    for (size_t i = 3000; i < 3300; i++) x[i] = 0; /* a zero row: scale-1 tiles */
    const float delayed = 64.0f;
    fp8t_stats_req req = {.n_images = 6};
    req.img[0] = (fp8t_image_spec){.kind = FP8T_IMG_SCALE, .fmt = FP8_E4M3, .scale = &delayed};
    req.img[1] = (fp8t_image_spec){.kind = FP8T_IMG_CURRENT, .fmt = FP8_E4M3};
    req.img[2] = (fp8t_image_spec){.kind = FP8T_IMG_CURRENT, .fmt = FP8_E5M2, .pow2 = 1};
    req.img[3] =
        (fp8t_image_spec){.kind = FP8T_IMG_TILES, .fmt = FP8_E4M3, .tile_r = 1, .tile_c = 128};
    req.img[4] =
        (fp8t_image_spec){.kind = FP8T_IMG_TILES, .fmt = FP8_E5M2, .tile_r = 16, .tile_c = 64};
    req.img[5] = (fp8t_image_spec){.kind = FP8T_IMG_MX};
    req.block = 100, req.block_img = 0;
    fp8t_block_raw list[112];
    req.block_list = list;
    fp8t_stats_raw raw;
    fp8t_stats_raw_compute(&raw, x, rows, cols, &req);
    T_CHECK(raw.n_images == 6 && raw.n == n, "images %d", raw.n_images);
    {
        /* the same rows in a wider buffer (req.ld; the gaps NaN and huge, never read): the
         * same statistics, byte for byte, the per-block list included */
        const int ld = cols + 5;
        float *w = malloc((size_t)rows * ld * sizeof *w);
        T_ASSERT(w, "out of memory");
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < ld; c++)
                w[(size_t)r * ld + c] =
                    c < cols ? x[(size_t)r * cols + c] : (c & 1 ? NAN : 1e30f);
        fp8t_block_raw list2[112];
        fp8t_stats_req sreq = req;
        sreq.ld = ld, sreq.block_list = list2;
        fp8t_stats_raw sraw;
        fp8t_stats_raw_compute(&sraw, w, rows, cols, &sreq);
        T_CHECK(memcmp(&sraw, &raw, sizeof raw) == 0, "strided rows: other statistics");
        T_CHECK(memcmp(list2, list, (size_t)raw.n_blocks * sizeof list[0]) == 0,
                "strided rows: another block list");
        free(w);
    }

    /* moments = fp8t_tensor_stats; image 0 = fp8t_fp8_stats at the delayed scale */
    fp8t_stats a, b;
    fp8t_stats_from_raw(&a, &raw, -1);
    fp8t_tensor_stats(&b, x, n);
    T_CHECK(a.n_nan == 1 && a.n_inf == 2 && a.n_zero == b.n_zero && a.min == b.min &&
                a.max == b.max && a.amax == b.amax && a.dynamic_range == b.dynamic_range,
            "moments");
    T_CLOSE(a.mean, b.mean, 0, 1e-12);
    T_CLOSE(a.std, b.std, 0, 1e-12);
    T_CLOSE(a.l1, b.l1, 0, 1e-12);
    fp8t_stats_from_raw(&a, &raw, 0);
    fp8t_fp8_stats(&b, x, n, delayed, FP8_E4M3);
    T_CHECK(a.underflow_pct == b.underflow_pct && a.saturation_pct == b.saturation_pct,
            "image 0 counts: under %g vs %g, sat %g vs %g", a.underflow_pct, b.underflow_pct,
            a.saturation_pct, b.saturation_pct);
    T_CLOSE(a.sqnr_db, b.sqnr_db, 1e-9, 0);
    T_CLOSE(a.cosine, b.cosine, 1e-14, 0);
    T_CHECK(raw.img[0].scale == 64.0 && raw.img[0].n_sat > 0 && raw.img[0].n_underflow > 0,
            "the data exercise both at the delayed scale");

    /* current scaling: the scale of the amax (Inf counts: scale 1) */
    const float qa = fp8_amax(x, n);
    for (int k = 1; k <= 2; k++) {
        const fp8_format f = req.img[k].fmt;
        const float s1 = fp8t_current_scale(qa, fp8_format_max(f), 0, req.img[k].pow2);
        T_CHECK(raw.img[k].scale == s1, "current scale %g vs %g", raw.img[k].scale, s1);
        fp8_fake_quantize(q, x, n, s1, f);
        for (size_t i = 0; i < n; i++) sc[i] = s1;
        check_image_vs_compare(&raw, k, x, q, n, count_clipped(x, n, sc, fp8_format_max(f)),
                               "current");
    }
    /* tiles: the block quantizer's image and per-element scale */
    for (int k = 3; k <= 4; k++) {
        const fp8t_image_spec *sp = &req.img[k];
        fp8t_block_quantize(codes, bscale, x, rows, cols, sp->tile_r, sp->tile_c, sp->fmt);
        fp8t_block_dequantize(q, codes, bscale, rows, cols, sp->tile_r, sp->tile_c, sp->fmt);
        const int nbc = (cols + sp->tile_c - 1) / sp->tile_c;
        for (size_t i = 0; i < n; i++)
            sc[i] = bscale[(i / cols) / sp->tile_r * nbc + (i % cols) / sp->tile_c];
        check_image_vs_compare(&raw, k, x, q, n, count_clipped(x, n, sc, fp8_format_max(sp->fmt)),
                               "tiles");
        T_CHECK(isnan(raw.img[k].scale), "tiles have no per-tensor scale");
    }
    /* MX: E8M0 blocks of 32 never clip a finite block; the Inf block is NaN */
    fp8t_mxfp8_quantize(codes, e8, x, rows, cols);
    fp8t_mxfp8_dequantize(q, codes, e8, rows, cols);
    T_CHECK(raw.img[5].n_sat == 0, "MX clipped %llu", (unsigned long long)raw.img[5].n_sat);
    T_CHECK(isnan(raw.img[5].err_sq), "a NaN image element propagates into the error");

    /* block=100 at the delayed scale = fp8t_block_fp8_stats */
    fp8t_stats bs[112];
    fp8t_block_fp8_stats(bs, x, n, 100, delayed, FP8_E4M3);
    T_CHECK(raw.n_blocks == 111 && raw.block == 100, "n_blocks %llu",
            (unsigned long long)raw.n_blocks);
    double worst = INFINITY, amax_max = 0, under_max = 0;
    size_t wi = 0, with = 0;
    int list_ok = 1;
    for (size_t i = 0; i < 111; i++) {
        if (bs[i].sqnr_db < worst) worst = bs[i].sqnr_db, wi = i;
        amax_max = fmax(amax_max, bs[i].amax);
        under_max = fmax(under_max, bs[i].underflow_pct);
        with += bs[i].underflow_pct > 0;
        list_ok &= list[i].amax == bs[i].amax && list[i].underflow_pct == bs[i].underflow_pct &&
                   fabs(list[i].sqnr_db - bs[i].sqnr_db) < 1e-9;
    }
    T_CHECK(list_ok, "block list = fp8t_block_fp8_stats");
    T_CHECK(raw.block_sqnr_min_index == wi && fabs(raw.block_sqnr_min_db - worst) < 1e-9 &&
                raw.block_amax_max == amax_max && raw.block_underflow_max_pct == under_max &&
                raw.blocks_with_underflow == with,
            "block summary: worst %llu vs %zu", (unsigned long long)raw.block_sqnr_min_index, wi);
    /* the images run on separate threads above 65536 elements: one and two threads give the
     * same bytes */
    {
        const int br = 300, bc = 256;
        float *big = malloc((size_t)br * bc * sizeof(float));
        T_ASSERT(big, "out of memory");
        fill(big, (size_t)br * bc);
        fp8t_stats_raw one, two;
        req.block_list = NULL;
        const int saved = omp_get_max_threads();
        omp_set_num_threads(1);
        fp8t_stats_raw_compute(&one, big, br, bc, &req);
        omp_set_num_threads(2);
        fp8t_stats_raw_compute(&two, big, br, bc, &req);
        omp_set_num_threads(saved);
        T_CHECK(!memcmp(&one, &two, sizeof one) && one.n_images == 6,
                "raw statistics depend on the thread count");
        free(big);
    }
    /* no request: moments only */
    fp8t_stats_raw_compute(&raw, x, rows, cols, NULL);
    T_CHECK(raw.n_images == 0 && raw.n_blocks == 0 && raw.n_finite == n - 3, "moments only");
    free(x), free(q), free(sc), free(codes), free(e8), free(bscale);
}

/* tile_stats: each tile of image 0 (TILES) on its own, against the straightforward reference
 * on the tile's elements with the tile's own current scale: the lowest SQNR and its (first)
 * tile, the highest underflow and its tile, the count of tiles with underflow; the block and
 * rowwise GEMMs' tile shapes, with and without power-of-two scales, both formats. */
static void test_tile_stats(void) {
    const int rows = 300, cols = 260;
    const size_t n = (size_t)rows * cols;
    float *x = malloc(n * sizeof(float)), *buf = malloc(n * sizeof(float));
    float *q = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)(uniform() - 0.5);
    /* rows with tiny values next to large ones: some tiles underflow, others do not */
    for (int c = 0; c < 200; c++) {
        x[(size_t)3 * cols + c] *= c % 3 ? 1e-4f : 1e3f; /* within a row */
        x[(size_t)150 * cols + c] *= 1e3f;               /* within a column */
    }
    x[5] = INFINITY; /* non-finite elements are left out of the error, as for the tensor */
    static const int tiles[][2] = {{1, 128}, {128, 1}, {128, 128}, {1, 260}, {300, 1}};
    for (size_t ti = 0; ti < sizeof tiles / sizeof tiles[0]; ti++)
        for (int pow2 = 0; pow2 < 2; pow2++)
            for (int f = 0; f < 2; f++) {
                const int tr = tiles[ti][0], tc = tiles[ti][1];
                const fp8_format fmt = f ? FP8_E5M2 : FP8_E4M3;
                fp8t_stats_req req;
                memset(&req, 0, sizeof req);
                req.n_images = 1;
                req.img[0] = (fp8t_image_spec){
                    .kind = FP8T_IMG_TILES, .fmt = fmt, .tile_r = tr, .tile_c = tc, .pow2 = pow2};
                req.tile_stats = 1;
                fp8t_stats_raw raw;
                fp8t_stats_raw_compute(&raw, x, rows, cols, &req);
                const int nbr = (rows + tr - 1) / tr, nbc = (cols + tc - 1) / tc;
                double worst = INFINITY, umax = -1;
                size_t wi = 0, ui = 0, with = 0;
                for (int t = 0; t < nbr * nbc; t++) {
                    const int r0 = t / nbc * tr, c0 = t % nbc * tc;
                    size_t m = 0;
                    for (int r = r0; r < rows && r < r0 + tr; r++)
                        for (int c = c0; c < cols && c < c0 + tc; c++)
                            buf[m++] = x[(size_t)r * cols + c];
                    const float sc =
                        fp8t_current_scale(fp8_amax(buf, m), fp8_format_max(fmt), 0.0f, pow2);
                    fp8_fake_quantize(q, buf, m, sc, fmt);
                    const ref_stats rs = reference(buf, q, m, 0, fp8_format_max(fmt));
                    const double up = rs.n_nz ? 100.0 * (double)rs.n_under / (double)rs.n_nz : 0;
                    if (rs.sqnr < worst) worst = rs.sqnr, wi = (size_t)t;
                    if (up > umax) umax = up, ui = (size_t)t;
                    with += rs.n_under > 0;
                }
                T_CHECK(
                    raw.n_tiles == (uint64_t)nbr * nbc && raw.tile_sqnr_min_index == wi &&
                        raw.tile_underflow_max_index == ui &&
                        raw.tile_underflow_max_pct == umax && raw.tiles_with_underflow == with,
                    "tiles %dx%d pow2 %d %s: %llu tiles, worst %llu (want %zu), underflow "
                    "%g at %llu (want %g at %zu), %llu with underflow (want %zu)",
                    tr, tc, pow2, fp8_format_name(fmt), (unsigned long long)raw.n_tiles,
                    (unsigned long long)raw.tile_sqnr_min_index, wi, raw.tile_underflow_max_pct,
                    (unsigned long long)raw.tile_underflow_max_index, umax, ui,
                    (unsigned long long)raw.tiles_with_underflow, with);
                T_CLOSE(raw.tile_sqnr_min_db, worst, 1e-9, 0);
                /* E5M2's range holds these data: only E4M3 tiles underflow */
                T_CHECK(with < (size_t)nbr * nbc && (fmt == FP8_E5M2 || with > 0),
                        "tiles %dx%d %s: %zu of %d tiles underflow", tr, tc, fp8_format_name(fmt),
                        with, nbr * nbc);
            }
    /* not asked: not computed */
    fp8t_stats_req req;
    memset(&req, 0, sizeof req);
    req.n_images = 1;
    req.img[0] =
        (fp8t_image_spec){.kind = FP8T_IMG_TILES, .fmt = FP8_E4M3, .tile_r = 1, .tile_c = 128};
    fp8t_stats_raw raw;
    fp8t_stats_raw_compute(&raw, x, rows, cols, &req);
    T_CHECK(raw.n_tiles == 0, "tile stats without tile_stats");
    free(x);
    free(buf);
    free(q);
}

/* ---- numerics/fp8_round_hd.h: the FP8 rounding the CUDA statistics run (tests/gpu checks
 * the same functions on all 2^32 floats on the device) ---- */

/* one float against fp8_decode(fp8_encode(y, fmt, 1)): returns the number of disagreements of
 * fp8t_round_sat (bit exact, a NaN for a NaN), fp8t_round_clamp (value and clipped flag) and,
 * inside its range, fp8t_round_nosat (value) */
static int round_check(uint32_t bits, int e5) {
    float y;
    memcpy(&y, &bits, sizeof y);
    const fp8_format fmt = e5 ? FP8_E5M2 : FP8_E4M3;
    const float ref = fp8_decode(fp8_encode(y, fmt, 1), fmt);
    const float got = fp8t_round_sat(y, e5);
    int bad = 0;
    if (isnan(ref))
        bad += !isnan(got);
    else
        bad += memcmp(&ref, &got, sizeof ref) != 0;
    if (!isnan(y)) {
        int cl;
        const float c = fp8t_round_clamp(y, e5, &cl);
        bad += c != ref || cl != fp8_overflows(y, fmt);
        const float a = fabsf(y);
        if (e5 ? a < FP8T_CLIP_FROM_E5M2 : a <= FP8T_CLIP_ABOVE_E4M3)
            bad += fp8t_round_nosat(y, e5) != ref;
    }
    return bad;
}

static void test_fast_round(void) {
    for (int e5 = 0; e5 < 2; e5++) {
        long bad = 0, n = 0;
        /* a stride through all floats, both signs, every exponent */
        for (uint64_t b = 0; b < (1ull << 32); b += 4099, n++)
            bad += round_check((uint32_t)b, e5);
        /* every float whose low 16 mantissa bits are 0 (the ties of both formats, the FP8
         * values themselves, the binade edges) and its neighbours */
        for (uint64_t h = 0; h < (1ull << 16); h++)
            for (int d = -2; d <= 2; d++, n++)
                bad += round_check((uint32_t)(h << 16) + (uint32_t)d, e5);
        /* every float in [2^-20, 2^17) of one mantissa pattern per exponent step of 1/4096 */
        for (uint32_t e = 107; e < 144; e++)
            for (uint32_t m = 0; m < (1u << 23); m += 2047, n++)
                bad += round_check(e << 23 | m, e5);
        T_CHECK(bad == 0, "%s: %ld of %ld floats disagree with fp8_decode(fp8_encode(y, 1))",
                e5 ? "E5M2" : "E4M3", bad, n);
    }
    /* the sign of zero: fp8t_round_sat keeps it, as the encoder does */
    T_CHECK(signbit(fp8t_round_sat(-1e-30f, 0)) && signbit(fp8t_round_sat(-0.0f, 1)),
            "zero sign");
}

static void test_mx_exponent_bits(void) {
    long bad = 0, n = 0;
    for (uint64_t b = 0; b <= 0x7fffffffull; b += 257, n++) {
        const uint32_t u = (uint32_t)b;
        float a;
        memcpy(&a, &u, sizeof a);
        bad += fp8t_mx_exponent_bits(a) != (int)fp8t_mx_scale_exponent(a);
    }
    const float edge[] = {0.0f,   448.0f,  448.00003f, 447.99997f, 896.0f, 1e-45f,
                          1e-38f, 3.4e38f, INFINITY,   NAN,        1.0f,   0x1.c00002p-140f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++, n++)
        bad += fp8t_mx_exponent_bits(edge[i]) != (int)fp8t_mx_scale_exponent(edge[i]);
    T_CHECK(bad == 0, "%ld of %ld amaxes give another E8M0 exponent than fp8t_mx_scale_exponent",
            bad, n);
}

static uint64_t xs_state = 88172645463325252ull;
static uint64_t xs_next(void) {
    xs_state ^= xs_state << 13, xs_state ^= xs_state >> 7, xs_state ^= xs_state << 17;
    return xs_state;
}

/* every positive finite FP8 value of both formats divided by sampled multipliers (arbitrary
 * normal floats, and current scales 448 / a) is d / m exactly where d / m is normal */
static void test_markstein(void) {
    float d[512];
    int nd = 0;
    for (int f = 0; f < 2; f++)
        for (int c = 1; c < 0x7f; c++) {
            const float v = fp8_decode((uint8_t)c, f ? FP8_E5M2 : FP8_E4M3);
            if (isfinite(v)) d[nd++] = v;
        }
    long bad = 0, n = 0;
    for (int it = 0; it < 200000; it++) {
        float m;
        uint32_t u = (uint32_t)(xs_next() % (200ull << 23)) + (27u << 23); /* 2^-100 .. 2^100 */
        memcpy(&m, &u, sizeof m);
        if (it & 1) m = 448.0f / m;
        const float r = 1.0f / m;
        for (int i = 0; i < nd; i++) {
            const float want = d[i] / m;
            if (!(fabsf(want) >= FLT_MIN) || isinf(want) || !(r >= FLT_MIN)) continue;
            n++;
            const float got = fp8t_div_markstein(d[i], m, r);
            bad += memcmp(&got, &want, sizeof got) != 0;
        }
    }
    T_CHECK(bad == 0 && n > 40000000, "%ld of %ld divisions differ from d / m", bad, n);
}

int main(void) {
    t_suite = "stats";
    T_RUN(test_hand_small);
    T_RUN(test_tensor_stats_vs_reference);
    T_RUN(test_fp8_stats_vs_reference);
    T_RUN(test_compare_and_self_cosine);
    T_RUN(test_block_stats);
    T_RUN(test_precision_large_offset);
    T_RUN(test_deterministic_across_threads);
    T_RUN(test_empty);
    T_RUN(test_saturation_is_clipping);
    T_RUN(test_raw_images);
    T_RUN(test_tile_stats);
    T_RUN(test_fast_round);
    T_RUN(test_mx_exponent_bits);
    T_RUN(test_markstein);
    T_MAIN_END();
}
