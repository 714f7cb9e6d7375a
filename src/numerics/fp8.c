/* fp8train — FP8 (E4M3, E5M2) and BF16 conversions, scalar and bulk.
 *
 * Every encoder is branch-free bit arithmetic on the float32 pattern so that the bulk loops
 * vectorize with plain SSE4 (x86-64-v2 has no per-lane variable shifts, so the subnormal
 * case is done with one float addition instead of a shift; see fp8_encode_bits).
 *
 * Semantics (identical to the CUDA toolkit's host code __nv_cvt_float_to_fp8, checked on all
 * 2^32 inputs by tests/test_fp8_exhaustive.cpp):
 *   - round to nearest, ties to even, on the exact float32 value; subnormals kept;
 *   - a result whose magnitude rounds above the format max "overflows":
 *       saturate=1 -> +-max (0x7E / 0x7B with the sign),
 *       saturate=0 -> E4M3 NaN with the sign (0x7F / 0xFF), E5M2 +-Inf (0x7C / 0xFC);
 *   - +-Inf input is an overflow like any other: saturate=1 gives +-max, saturate=0 gives
 *     E4M3 +-NaN code / E5M2 +-Inf;
 *   - NaN input (any sign, any payload) gives the positive NaN code 0x7F in both formats;
 *   - the sign of zero (and of values that underflow to zero) is kept.
 * BF16: round to nearest even, overflow to +-Inf, NaN -> canonical positive 0x7FFF. */
#include "fp8train/fp8.h"

#include <math.h>
#include <string.h>

/* Above this many elements the bulk loops use OpenMP threads. Every bulk result is a pure
 * per-element function (or a max, which is order-free), so threading never changes a bit. */
#define FP8_OMP_MIN_N 65536

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The constants that describe one FP8 format in terms of the float32 bit pattern. */
typedef struct {
    int mant_shift;       /* 23 - fp8 mantissa bits: 20 (E4M3) or 21 (E5M2) */
    int32_t min_normal;   /* float32 bits of the smallest fp8 normal: 2^-6 / 2^-14 */
    int32_t rebias;       /* (127 - fp8 bias) << fp8 mantissa bits */
    float sub_magic;      /* float whose ulp is the fp8 subnormal step: 2^14 / 2^7 */
    int32_t max_code;     /* 0x7E / 0x7B */
    int32_t ovf_nosat;    /* overflow code without saturation: NaN 0x7F / Inf 0x7C */
} fp8_consts;

static inline fp8_consts fp8_consts_of(fp8_format fmt) {
    fp8_consts c;
    if (fmt == FP8_E5M2) {
        c.mant_shift = 21, c.min_normal = 113 << 23, c.rebias = 112 << 2, c.sub_magic = 128.0f;
        c.max_code = 0x7B, c.ovf_nosat = 0x7C;
    } else {
        c.mant_shift = 20, c.min_normal = 121 << 23, c.rebias = 120 << 3,
        c.sub_magic = 16384.0f;
        c.max_code = 0x7E, c.ovf_nosat = 0x7F;
    }
    return c;
}

/* Encode one float. Written as selects over straight-line integer code so that gcc turns the
 * bulk loops into SSE vector code; inlined with constant `c` and `saturate` it folds down to
 * about 20 vector instructions per 4 elements.
 *   normal:    add (half ulp - 1) plus the kept lsb (ties to even), drop the low bits, rebias;
 *              a carry out of the mantissa correctly bumps the exponent.
 *   subnormal: |x| + magic rounds |x| to a multiple of the fp8 subnormal step in the FPU
 *              (round to nearest even); the low bits of the sum are the fp8 code, and a value
 *              that rounds up to the smallest normal yields exactly that normal's code. */
static inline uint8_t fp8_encode_bits(uint32_t u, fp8_consts c, int saturate) {
    const int32_t sign = (int32_t)(u >> 31) << 7;
    const uint32_t a = u & 0x7FFFFFFFu;
    const uint32_t half_m1 = (1u << (c.mant_shift - 1)) - 1u;
    const uint32_t lsb = (a >> c.mant_shift) & 1u;
    /* a + half_m1 + lsb <= 0x7FFFFFFF + 2^20: no wrap in uint32 */
    const int32_t normal = (int32_t)((a + half_m1 + lsb) >> c.mant_shift) - c.rebias;
    const float sum = f32_from_bits(a) + c.sub_magic;
    const int32_t sub = (int32_t)(f32_bits(sum) - f32_bits(c.sub_magic));
    /* all-ones / all-zero masks rather than ?: so gcc if-converts into vector blends */
    const int32_t is_sub = -(int32_t)((int32_t)a < c.min_normal);
    int32_t code = (sub & is_sub) | (normal & ~is_sub);
    const int32_t ovf_code = saturate ? c.max_code : c.ovf_nosat;
    const int32_t is_ovf = -(int32_t)(code > c.max_code);
    code = ((ovf_code & is_ovf) | (code & ~is_ovf)) | sign;
    const int32_t is_nan = -(int32_t)((int32_t)a > 0x7F800000); /* NaN: positive 0x7F */
    code = (0x7F & is_nan) | (code & ~is_nan);
    return (uint8_t)code;
}

uint8_t fp8_encode(float x, fp8_format fmt, int saturate) {
    return fp8_encode_bits(f32_bits(x), fp8_consts_of(fmt), saturate != 0);
}

float fp8_decode(uint8_t bits, fp8_format fmt) {
    const uint32_t sign = (uint32_t)(bits >> 7) << 31;
    float mag;
    if (fmt == FP8_E5M2) {
        const uint32_t e = (bits >> 2) & 31u, m = bits & 3u;
        if (e == 31u) mag = m ? NAN : INFINITY;
        else if (e == 0u) mag = (float)m * 0x1p-16f; /* exact */
        else mag = f32_from_bits(((e + 112u) << 23) | (m << 21));
    } else {
        const uint32_t e = (bits >> 3) & 15u, m = bits & 7u;
        if (e == 15u && m == 7u) mag = NAN;
        else if (e == 0u) mag = (float)m * 0x1p-9f; /* exact */
        else mag = f32_from_bits(((e + 120u) << 23) | (m << 20));
    }
    return f32_from_bits(f32_bits(mag) | sign);
}

static inline uint16_t bf16_encode_bits(uint32_t u) {
    const uint32_t lsb = (u >> 16) & 1u;
    const uint16_t rounded = (uint16_t)((u + 0x7FFFu + lsb) >> 16); /* no wrap for non-NaN */
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? (uint16_t)0x7FFFu : rounded;
}

uint16_t bf16_encode(float x) { return bf16_encode_bits(f32_bits(x)); }

float bf16_decode(uint16_t bits) { return f32_from_bits((uint32_t)bits << 16); }

float fp8_format_max(fp8_format fmt) { return fmt == FP8_E5M2 ? FP8_E5M2_MAX : FP8_E4M3_MAX; }

const char *fp8_format_name(fp8_format fmt) { return fmt == FP8_E5M2 ? "e5m2" : "e4m3"; }

/* ---- bulk ---- */

/* The loops below are compiled at O3 so gcc's vectorizer (not on at -O2 in gcc 12) turns them
 * into SSE code; see bench/bench_numerics.c for the measured rates. */
#define FP8_HOT __attribute__((optimize("O3", "tree-vectorize")))

/* One vectorizable kernel per (format, saturate) so all constants fold. Returns the max of
 * |x| as float32 bits: for non-negative floats the bit patterns order like the values, and
 * every NaN pattern is above +Inf's, so an integer max is an amax in which NaN wins. */
#define DEFINE_QUANT_KERNEL(NAME, FMT, SAT)                                                   \
    FP8_HOT static uint32_t NAME(uint8_t *restrict out, const float *restrict x, size_t n,   \
                                 float scale) {                                               \
        const fp8_consts c = fp8_consts_of(FMT);                                              \
        uint32_t amax_bits = 0;                                                               \
        for (size_t i = 0; i < n; i++) {                                                      \
            const uint32_t xa = f32_bits(x[i]) & 0x7FFFFFFFu;                                 \
            amax_bits = xa > amax_bits ? xa : amax_bits;                                      \
            out[i] = fp8_encode_bits(f32_bits(x[i] * scale), c, SAT);                         \
        }                                                                                     \
        return amax_bits;                                                                     \
    }
DEFINE_QUANT_KERNEL(quant_e4m3_sat, FP8_E4M3, 1)
DEFINE_QUANT_KERNEL(quant_e4m3_nosat, FP8_E4M3, 0)
DEFINE_QUANT_KERNEL(quant_e5m2_sat, FP8_E5M2, 1)
DEFINE_QUANT_KERNEL(quant_e5m2_nosat, FP8_E5M2, 0)

typedef uint32_t (*quant_kernel)(uint8_t *restrict, const float *restrict, size_t, float);

static quant_kernel quant_kernel_of(fp8_format fmt, int saturate) {
    if (fmt == FP8_E5M2) return saturate ? quant_e5m2_sat : quant_e5m2_nosat;
    return saturate ? quant_e4m3_sat : quant_e4m3_nosat;
}

/* Positive float from |x| bits; any NaN pattern becomes the canonical quiet NaN. */
static float amax_from_bits(uint32_t bits) { return bits > 0x7F800000u ? NAN : f32_from_bits(bits); }

/* Work is split into fixed chunks so each thread runs the vector kernel on a long range. */
#define FP8_CHUNK 16384

float fp8_quantize_amax(uint8_t *out, const float *x, size_t n, float scale, fp8_format fmt,
                        int saturate) {
    const quant_kernel k = quant_kernel_of(fmt, saturate);
    if (n < FP8_OMP_MIN_N) return amax_from_bits(k(out, x, n, scale));
    const size_t nchunks = (n + FP8_CHUNK - 1) / FP8_CHUNK;
    uint32_t amax_bits = 0;
#pragma omp parallel for schedule(static) reduction(max : amax_bits)
    for (size_t ch = 0; ch < nchunks; ch++) {
        const size_t lo = ch * FP8_CHUNK, len = n - lo < FP8_CHUNK ? n - lo : FP8_CHUNK;
        const uint32_t m = k(out + lo, x + lo, len, scale);
        amax_bits = m > amax_bits ? m : amax_bits;
    }
    return amax_from_bits(amax_bits);
}

void fp8_quantize(uint8_t *out, const float *x, size_t n, float scale, fp8_format fmt,
                  int saturate) {
    /* The amax comes for free in the same pass (the loop is bound by the encode). */
    (void)fp8_quantize_amax(out, x, n, scale, fmt, saturate);
}

FP8_HOT static uint32_t amax_kernel(const float *restrict x, size_t n) {
    uint32_t amax_bits = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t xa = f32_bits(x[i]) & 0x7FFFFFFFu;
        amax_bits = xa > amax_bits ? xa : amax_bits;
    }
    return amax_bits;
}

float fp8_amax(const float *x, size_t n) {
    if (n < FP8_OMP_MIN_N) return amax_from_bits(amax_kernel(x, n));
    const size_t nchunks = (n + FP8_CHUNK - 1) / FP8_CHUNK;
    uint32_t amax_bits = 0;
#pragma omp parallel for schedule(static) reduction(max : amax_bits)
    for (size_t ch = 0; ch < nchunks; ch++) {
        const size_t lo = ch * FP8_CHUNK, len = n - lo < FP8_CHUNK ? n - lo : FP8_CHUNK;
        const uint32_t m = amax_kernel(x + lo, len);
        amax_bits = m > amax_bits ? m : amax_bits;
    }
    return amax_from_bits(amax_bits);
}

void fp8_dequantize(float *out, const uint8_t *codes, size_t n, float scale_inv,
                    fp8_format fmt) {
    /* [256] decode table with the scale folded in: decode(c) * scale_inv, the same float
     * product the per-element formula gives. Cheap to build next to any tensor worth it. */
    float table[256];
    for (int c = 0; c < 256; c++) table[c] = fp8_decode((uint8_t)c, fmt) * scale_inv;
#pragma omp parallel for schedule(static) if (n >= FP8_OMP_MIN_N)
    for (size_t i = 0; i < n; i++) out[i] = table[codes[i]];
}

/* Quantize-dequantize with saturation: decode(encode(x*scale)) / scale. The 256-entry table
 * holds the decoded values; the division stays per element to match the formula exactly. */
FP8_HOT static void fake_quant_kernel(float *out, const float *x, size_t n, float scale,
                                      fp8_format fmt, const float *table) {
    const fp8_consts c = fp8_consts_of(fmt);
    for (size_t i = 0; i < n; i++) out[i] = table[fp8_encode_bits(f32_bits(x[i] * scale), c, 1)] / scale;
}

void fp8_fake_quantize(float *out, const float *x, size_t n, float scale, fp8_format fmt) {
    float table[256]; /* decode(c) */
    for (int c = 0; c < 256; c++) table[c] = fp8_decode((uint8_t)c, fmt);
    const size_t nchunks = (n + FP8_CHUNK - 1) / FP8_CHUNK;
#pragma omp parallel for schedule(static) if (n >= FP8_OMP_MIN_N)
    for (size_t ch = 0; ch < nchunks; ch++) {
        const size_t lo = ch * FP8_CHUNK, len = n - lo < FP8_CHUNK ? n - lo : FP8_CHUNK;
        fake_quant_kernel(out + lo, x + lo, len, scale, fmt, table);
    }
}

FP8_HOT static void bf16_round_kernel(float *out, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        out[i] = f32_from_bits((uint32_t)bf16_encode_bits(f32_bits(x[i])) << 16);
}

void bf16_round(float *out, const float *x, size_t n) {
    const size_t nchunks = (n + FP8_CHUNK - 1) / FP8_CHUNK;
#pragma omp parallel for schedule(static) if (n >= FP8_OMP_MIN_N)
    for (size_t ch = 0; ch < nchunks; ch++) {
        const size_t lo = ch * FP8_CHUNK, len = n - lo < FP8_CHUNK ? n - lo : FP8_CHUNK;
        bf16_round_kernel(out + lo, x + lo, len);
    }
}
