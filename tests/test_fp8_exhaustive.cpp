/* fp8train — exhaustive tests of the FP8 and BF16 encoders.
 *
 * Every one of the 2^32 float32 bit patterns goes through fp8_encode (E4M3, E5M2, with and
 * without saturation), bf16_encode, and the bulk fp8_quantize_amax / bf16_round, and each
 * result is checked against two independent references:
 *   1. the CUDA toolkit's host code: __nv_cvt_float_to_fp8 and __float2bfloat16_rn (bit for
 *      bit, including NaN and Inf handling);
 *   2. a reference written here in double precision that knows nothing of bit layouts: the
 *      value is rounded with rint() to the grid of the format's binade, then compared with
 *      the *value* of the code we produced (decoded by a formula written here).
 * The scalar and bulk encoders must also agree with each other on every input.
 *
 * Under AddressSanitizer (make test-sanitize) the instrumented build is ~10x slower, so there
 * it checks every 61st block of 2^15 patterns (all exponents, ~1/61 of the inputs) and says so;
 * FP8TRAIN_EXHAUSTIVE_STRIDE=k does the same on demand. The plain build checks all inputs. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fp8train/fp8.h"
#include "test.h"

static float f_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t u_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- the double-precision reference ---- */

struct fmt_desc {
    fp8_format fmt;
    int mant_bits; /* 3 / 2 */
    int bias;      /* 7 / 15 */
    int emin;      /* exponent of the smallest normal: -6 / -14 */
    double maxv;   /* 448 / 57344 */
    bool has_inf;  /* E5M2 */
};
static const fmt_desc FMTS[2] = {{FP8_E4M3, 3, 7, -6, 448.0, false},
                                 {FP8_E5M2, 2, 15, -14, 57344.0, true}};

/* Value of an FP8 code from the format definition: (-1)^s 2^(e-bias) (1 + m/2^M), subnormal
 * 2^(1-bias) (m/2^M); E4M3: S.1111.111 is NaN; E5M2: exponent 31 is Inf (m=0) or NaN. */
static double ref_decode(const fmt_desc &d, int code) {
    const int s = code >> 7, e = (code >> d.mant_bits) & ((1 << (7 - d.mant_bits)) - 1);
    const int m = code & ((1 << d.mant_bits) - 1), emax_field = (1 << (7 - d.mant_bits)) - 1;
    double v;
    if (!d.has_inf && e == emax_field && m == (1 << d.mant_bits) - 1)
        v = NAN;
    else if (d.has_inf && e == emax_field)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = std::ldexp((double)m, 1 - d.bias - d.mant_bits);
    else
        v = std::ldexp(1.0 + std::ldexp((double)m, -d.mant_bits), e - d.bias);
    return s ? -v : v;
}

/* Per float32 exponent field: the spacing of the target grid in that binade (the binade's own
 * step for normal results, the fixed subnormal step below the smallest normal). Computing it
 * once per exponent class keeps the reference cheap; the rounding itself is per input. */
struct grid {
    double step[256], inv_step[256];
    void init(int mant_bits, int emin) {
        for (int E = 0; E < 256; E++) {
            const int k = E == 0 ? -126 : E - 127; /* binade of the float (subnormals: below) */
            const int ek = k > emin ? k : emin;
            step[E] = std::ldexp(1.0, ek - mant_bits);
            inv_step[E] = std::ldexp(1.0, mant_bits - ek);
        }
    }
};
static grid GRID[2], GRID_BF16;
static double DEC[2][256];

enum { R_VALUE, R_NAN_CODE, R_NAN_ANY };
/* Expected result: a value (sign included), or "NaN": R_NAN_CODE when the code must be
 * exactly `*nan_code`. Semantics: round to nearest even; overflow (result above max, or Inf
 * input) clamps to +-max with saturation, else E4M3 -> NaN with the input's sign (0x7F|s),
 * E5M2 -> +-Inf; NaN input -> code 0x7F (the toolkit's canonical NaN, sign dropped). */
/* |x| rounded to the format's grid (Inf for an infinite x; x must not be NaN). The part of the
 * reference that does not depend on saturation, computed once per format and input. */
static double ref_round(const grid &g, float x) {
    if (std::isinf(x)) return INFINITY;
    const int E = (int)((u_of(x) >> 23) & 0xFF);
    return std::rint(std::fabs((double)x) * g.inv_step[E]) * g.step[E]; /* exact; ties to even */
}

/* The rest of the reference, given r = ref_round(x) (ignored for a NaN x). */
static int ref_fp8_of(const fmt_desc &d, float x, double r, int sat, double *val, int *nan_code) {
    const int neg = (int)(u_of(x) >> 31);
    if (std::isnan(x)) {
        *nan_code = 0x7F;
        return R_NAN_CODE;
    }
    if (r > d.maxv) {
        if (sat)
            r = d.maxv;
        else if (d.has_inf)
            r = INFINITY;
        else {
            *nan_code = 0x7F | (neg << 7);
            return R_NAN_CODE;
        }
    }
    *val = neg ? -r : r;
    return R_VALUE;
}

static bool same_value(double got, double want) {
    return got == want && std::signbit(got) == std::signbit(want);
}

/* BF16 reference: grid with 7 mantissa bits, normal range from 2^-126; above the largest
 * finite bf16 -> Inf; NaN -> any NaN here (the toolkit comparison pins the exact bits). */
static const double BF16_MAX = 0x1.FEp127;
static bool ref_bf16_ok(float x, uint16_t got_bits) {
    const float got = f_of((uint32_t)got_bits << 16);
    if (std::isnan(x)) return std::isnan(got);
    double r;
    if (std::isinf(x))
        r = INFINITY;
    else {
        const int E = (int)((u_of(x) >> 23) & 0xFF);
        r = std::rint(std::fabs((double)x) * GRID_BF16.inv_step[E]) * GRID_BF16.step[E];
        if (r > BF16_MAX) r = INFINITY;
    }
    return same_value((double)got, std::signbit(x) ? -r : r);
}

/* ---- the sweep ---- */

#define BLOCK (1u << 15) /* patterns per work item; below the bulk OpenMP threshold */
#define NBLOCKS (1u << 17)

struct failures {
    long long n[6] = {0, 0, 0, 0, 0, 0}; /* cuda, double ref, bulk, bf16 cuda, bf16 ref, amax */
};
static const char *FAIL_WHAT[6] = {"fp8 vs CUDA",  "fp8 vs double reference",  "bulk vs scalar",
                                   "bf16 vs CUDA", "bf16 vs double reference", "bulk amax"};
static int n_reported = 0;

static const char *fmt_name_safe(int fmt) {
    return fmt == 0 ? "e4m3" : fmt == 1 ? "e5m2" : "bf16";
}

static void report(int what, uint32_t u, int fmt, int sat, unsigned got, unsigned want) {
#pragma omp critical(fp8_report)
    if (n_reported++ < 12)
        printf("  mismatch (%s): x=0x%08x (%.9g) fmt=%s sat=%d got 0x%02x want 0x%02x\n",
               FAIL_WHAT[what], u, (double)f_of(u), fmt_name_safe(fmt), sat, got, want);
}

static unsigned stride_blocks(void) {
    const char *s = getenv("FP8TRAIN_EXHAUSTIVE_STRIDE");
    if (s && atoi(s) > 0) return (unsigned)atoi(s);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
    return 61;
#else
    return 1;
#endif
}

/* A full sweep takes minutes on 2 cores (more on a busy machine): say how far it is, every
 * eighth of the blocks, so a long silence never looks like a hang. */
static void progress(unsigned done, unsigned total, double t0) {
    const unsigned step = total / 8 ? total / 8 : 1;
    if (done % step != 0 || done + step > total) return; /* no "99%" just before the end */
    const double el = omp_get_wtime() - t0;
    printf("  ... %u%% of the sweep after %.0f s (about %.0f s to go)\n", 100 * done / total, el,
           el * (total - done) / done);
    fflush(stdout);
}

static failures sweep(unsigned stride) {
    failures tot;
    const unsigned total = (NBLOCKS + stride - 1) / stride;
    unsigned done = 0;
    const double t0 = omp_get_wtime();
    const __nv_fp8_interpretation_t interp[2] = {__NV_E4M3, __NV_E5M2};
    const __nv_saturation_t satm[2] = {__NV_NOSAT, __NV_SATFINITE};
#pragma omp parallel num_threads(2)
    {
        failures f;
        std::vector<float> x(BLOCK), xr(BLOCK);    /* [BLOCK] inputs, bf16_round out */
        std::vector<float> fq(2 * (size_t)BLOCK);  /* [fmt][BLOCK] fake_quantize out */
        std::vector<uint8_t> q(4 * (size_t)BLOCK); /* [fmt*2+sat][BLOCK] bulk codes */
#pragma omp for schedule(dynamic, 16)
        for (unsigned b = 0; b < NBLOCKS; b += stride) {
            const uint32_t base = b * BLOCK;
            uint32_t amax_bits = 0;
            for (uint32_t i = 0; i < BLOCK; i++) {
                x[i] = f_of(base + i);
                const uint32_t a = (base + i) & 0x7FFFFFFFu;
                amax_bits = a > amax_bits ? a : amax_bits;
            }
            for (int fm = 0; fm < 2; fm++)
                for (int s = 0; s < 2; s++) {
                    const float am = fp8_quantize_amax(&q[(size_t)(fm * 2 + s) * BLOCK], x.data(),
                                                       BLOCK, 1.0f, (fp8_format)fm, s);
                    const bool ok =
                        amax_bits > 0x7F800000u ? std::isnan(am) : u_of(am) == amax_bits;
                    if (!ok) f.n[5]++, report(5, base, fm, s, 0, 0);
                }
            bf16_round(xr.data(), x.data(), BLOCK);
            for (int fm = 0; fm < 2; fm++)
                fp8_fake_quantize(&fq[(size_t)fm * BLOCK], x.data(), BLOCK, 1.0f, (fp8_format)fm);
            for (uint32_t i = 0; i < BLOCK; i++) {
                const uint32_t u = base + i;
                const float xi = x[i];
                const bool xnan = std::isnan(xi);
                for (int fm = 0; fm < 2; fm++) {
                    const double rounded = xnan ? 0.0 : ref_round(GRID[fm], xi);
                    for (int s = 0; s < 2; s++) {
                        const unsigned got = fp8_encode(xi, (fp8_format)fm, s);
                        const unsigned cuda = __nv_cvt_float_to_fp8(xi, satm[s], interp[fm]);
                        if (got != cuda) f.n[0]++, report(0, u, fm, s, got, cuda);
                        const unsigned bulk = q[(size_t)(fm * 2 + s) * BLOCK + i];
                        if (bulk != got) f.n[2]++, report(2, u, fm, s, bulk, got);
                        /* fake quantize (saturating) = decode of the saturating code, bit exact */
                        if (s == 1 && u_of(fq[(size_t)fm * BLOCK + i]) !=
                                          u_of(fp8_decode(got, (fp8_format)fm)))
                            f.n[2]++,
                                report(2, u, fm, s, u_of(fq[(size_t)fm * BLOCK + i]) >> 24, got);
                        double val = 0;
                        int nan_code = 0;
                        const int kind = ref_fp8_of(FMTS[fm], xi, rounded, s, &val, &nan_code);
                        const bool ok = kind == R_VALUE ? same_value(DEC[fm][got], val)
                                                        : got == (unsigned)nan_code;
                        if (!ok) {
                            f.n[1]++;
#pragma omp critical(fp8_report)
                            if (n_reported++ < 12)
                                printf("  mismatch (double reference): x=0x%08x (%.9g) %s sat=%d "
                                       "got 0x%02x = %.9g, want %.9g%s\n",
                                       u, (double)xi, fmt_name_safe(fm), s, got, DEC[fm][got],
                                       val, kind == R_VALUE ? "" : " (a NaN code)");
                        }
                    }
                }
                const uint16_t hb = bf16_encode(xi);
                const __nv_bfloat16 cb = __float2bfloat16_rn(xi);
                uint16_t cbits;
                memcpy(&cbits, &cb, 2);
                if (hb != cbits) f.n[3]++, report(3, u, 9, 0, hb, cbits);
                if (u_of(xr[i]) != ((uint32_t)hb << 16)) f.n[2]++, report(2, u, 9, 0, 0, 0);
                if (!ref_bf16_ok(xi, hb)) f.n[4]++, report(4, u, 9, 0, hb, 0);
            }
            unsigned now;
#pragma omp atomic capture
            now = ++done;
            if (now % (total / 8 ? total / 8 : 1) == 0) {
#pragma omp critical(fp8_report)
                progress(now, total, t0);
            }
        }
#pragma omp critical(fp8_sum)
        for (int k = 0; k < 6; k++) tot.n[k] += f.n[k];
    }
    return tot;
}

static void test_all_float32_inputs(void) {
    const unsigned stride = stride_blocks();
    if (stride > 1)
        printf("  note: checking every %u-th block of %u patterns (sanitizer build or "
               "FP8TRAIN_EXHAUSTIVE_STRIDE), not all 2^32\n",
               stride, BLOCK);
    const double t0 = omp_get_wtime();
    const failures f = sweep(stride);
    const double t1 = omp_get_wtime();
    printf(
        "  %s 2^32 float32 inputs x {e4m3,e5m2} x {sat,nosat} + bf16 in %.1f s on %d threads\n",
        stride > 1 ? "swept a subset of" : "swept all", t1 - t0, 2);
    for (int k = 0; k < 6; k++) T_CHECK(f.n[k] == 0, "%lld mismatches: %s", f.n[k], FAIL_WHAT[k]);
}

/* ---- decode and round trip ---- */

static void test_decode_all_codes(void) {
    const __nv_fp8_interpretation_t interp[2] = {__NV_E4M3, __NV_E5M2};
    for (int fm = 0; fm < 2; fm++)
        for (int c = 0; c < 256; c++) {
            const float got = fp8_decode((uint8_t)c, (fp8_format)fm);
            const __half_raw hr = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, interp[fm]);
            const float cuda = __half2float(__half(hr));
            const double want = DEC[fm][c];
            if (std::isnan(want)) {
                T_CHECK(std::isnan(got) && std::isnan(cuda), "%s code 0x%02x should be NaN",
                        fmt_name_safe(fm), c);
            } else {
                T_CHECK(same_value(got, want), "%s code 0x%02x: got %.9g want %.9g",
                        fmt_name_safe(fm), c, (double)got, want);
                T_CHECK(u_of(got) == u_of(cuda), "%s code 0x%02x: got %.9g, CUDA %.9g",
                        fmt_name_safe(fm), c, (double)got, (double)cuda);
            }
        }
    /* the NaN codes are exactly: E4M3 0x7F, 0xFF; E5M2 exponent 31 with m != 0 (6 codes) */
    int nan_count[2] = {0, 0};
    for (int fm = 0; fm < 2; fm++)
        for (int c = 0; c < 256; c++)
            nan_count[fm] += std::isnan(fp8_decode((uint8_t)c, (fp8_format)fm));
    T_CHECK(nan_count[0] == 2 && nan_count[1] == 6, "NaN codes: e4m3 %d e5m2 %d", nan_count[0],
            nan_count[1]);
    T_CHECK(fp8_decode(0x7E, FP8_E4M3) == 448.0f && fp8_decode(0x7B, FP8_E5M2) == 57344.0f,
            "max codes");
    T_CHECK(fp8_decode(0x01, FP8_E4M3) == 0x1p-9f && fp8_decode(0x01, FP8_E5M2) == 0x1p-16f,
            "smallest subnormals");
}

static void test_round_trip_every_finite_code(void) {
    for (int fm = 0; fm < 2; fm++)
        for (int c = 0; c < 256; c++) {
            const float v = fp8_decode((uint8_t)c, (fp8_format)fm);
            if (!std::isfinite(v)) continue;
            for (int s = 0; s < 2; s++)
                T_CHECK(fp8_encode(v, (fp8_format)fm, s) == c,
                        "%s 0x%02x sat %d -> %.9g -> 0x%02x", fmt_name_safe(fm), c, s, (double)v,
                        fp8_encode(v, (fp8_format)fm, s));
        }
    /* E5M2 Inf: kept without saturation, clamped to max with it (as the toolkit does) */
    T_CHECK(fp8_encode(INFINITY, FP8_E5M2, 0) == 0x7C &&
                fp8_encode(-INFINITY, FP8_E5M2, 0) == 0xFC,
            "e5m2 Inf nosat");
    T_CHECK(fp8_encode(INFINITY, FP8_E5M2, 1) == 0x7B &&
                fp8_encode(-INFINITY, FP8_E5M2, 1) == 0xFB,
            "e5m2 Inf sat");
}

/* The toolkit's NaN and Inf conventions, pinned down (documented in docs/numerics.md). */
static void test_toolkit_nan_inf_conventions(void) {
    const float nans[4] = {f_of(0x7FC00000u), f_of(0xFFC00000u), f_of(0x7F800001u),
                           f_of(0xFFFFFFFFu)};
    for (int k = 0; k < 4; k++) {
        for (int fm = 0; fm < 2; fm++)
            for (int s = 0; s < 2; s++)
                T_CHECK(fp8_encode(nans[k], (fp8_format)fm, s) == 0x7F,
                        "NaN 0x%08x -> positive NaN code 0x7F", u_of(nans[k]));
        /* bf16: any NaN (signalling or negative too) becomes the positive quiet NaN 0x7FFF */
        T_CHECK(bf16_encode(nans[k]) == 0x7FFF, "bf16 NaN 0x%08x -> 0x%04x", u_of(nans[k]),
                bf16_encode(nans[k]));
        const __nv_bfloat16 cb = __float2bfloat16_rn(nans[k]);
        uint16_t cbits;
        memcpy(&cbits, &cb, 2);
        T_CHECK(cbits == 0x7FFF, "toolkit bf16 NaN is 0x%04x", cbits);
    }
    T_CHECK(fp8_encode(INFINITY, FP8_E4M3, 1) == 0x7E &&
                fp8_encode(-INFINITY, FP8_E4M3, 1) == 0xFE,
            "e4m3 Inf sat -> +-448");
    T_CHECK(fp8_encode(INFINITY, FP8_E4M3, 0) == 0x7F &&
                fp8_encode(-INFINITY, FP8_E4M3, 0) == 0xFF,
            "e4m3 Inf nosat -> NaN code with the sign");
    T_CHECK(fp8_encode(-1e6f, FP8_E4M3, 0) == 0xFF, "e4m3 overflow nosat keeps the sign");
}

int main(void) {
    t_suite = "fp8_exhaustive";
    for (int fm = 0; fm < 2; fm++) {
        GRID[fm].init(FMTS[fm].mant_bits, FMTS[fm].emin);
        for (int c = 0; c < 256; c++) DEC[fm][c] = ref_decode(FMTS[fm], c);
    }
    GRID_BF16.init(7, -126);
    T_RUN(test_decode_all_codes);
    T_RUN(test_round_trip_every_finite_code);
    T_RUN(test_toolkit_nan_inf_conventions);
    T_RUN(test_all_float32_inputs);
    T_MAIN_END();
}
