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
    int mant_shift;     /* 23 - fp8 mantissa bits: 20 (E4M3) or 21 (E5M2) */
    int32_t min_normal; /* float32 bits of the smallest fp8 normal: 2^-6 / 2^-14 */
    int32_t rebias;     /* (127 - fp8 bias) << fp8 mantissa bits */
    float sub_magic;    /* float whose ulp is the fp8 subnormal step: 2^14 / 2^7 */
    int32_t max_code;   /* 0x7E / 0x7B */
    int32_t ovf_nosat;  /* overflow code without saturation: NaN 0x7F / Inf 0x7C */
} fp8_consts;

static inline fp8_consts fp8_consts_of(fp8_format fmt) {
    fp8_consts c;
    if (fmt == FP8_E5M2) {
        c.mant_shift = 21, c.min_normal = 113 << 23, c.rebias = 112 << 2, c.sub_magic = 128.0f;
        c.max_code = 0x7B, c.ovf_nosat = 0x7C;
    } else {
        c.mant_shift = 20, c.min_normal = 121 << 23, c.rebias = 120 << 3, c.sub_magic = 16384.0f;
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
static inline uint32_t fp8_encode_bits(uint32_t u, fp8_consts c, int saturate) {
    const uint32_t a = u & 0x7FFFFFFFu;
    const uint32_t sign = (u >> 24) & 0x80u;
    /* normal: (a + half ulp - 1 + lsb - rebias) >> shift. Wraps (harmlessly, in unsigned) only
     * for |x| below the smallest normal, whose result the subnormal path replaces. */
    const uint32_t bias_adj =
        ((1u << (c.mant_shift - 1)) - 1u) - ((uint32_t)c.rebias << c.mant_shift);
    const uint32_t normal = (a + ((a >> c.mant_shift) & 1u) + bias_adj) >> c.mant_shift;
    const uint32_t sub = f32_bits(f32_from_bits(a) + c.sub_magic) - f32_bits(c.sub_magic);
    uint32_t code = (int32_t)a < c.min_normal ? sub : normal;
    if (saturate)
        code = code < (uint32_t)c.max_code ? code : (uint32_t)c.max_code;
    else
        code = code > (uint32_t)c.max_code ? (uint32_t)c.ovf_nosat : code;
    code |= sign;
    return (int32_t)a > 0x7F800000 ? 0x7Fu : code; /* NaN: the positive code 0x7F */
}

uint8_t fp8_encode(float x, fp8_format fmt, int saturate) {
    return (uint8_t)fp8_encode_bits(f32_bits(x), fp8_consts_of(fmt), saturate != 0);
}

float fp8_decode(uint8_t bits, fp8_format fmt) {
    const uint32_t sign = (uint32_t)(bits >> 7) << 31;
    float mag;
    if (fmt == FP8_E5M2) {
        const uint32_t e = (bits >> 2) & 31u, m = bits & 3u;
        if (e == 31u)
            mag = m ? NAN : INFINITY;
        else if (e == 0u)
            mag = (float)m * 0x1p-16f; /* exact */
        else
            mag = f32_from_bits(((e + 112u) << 23) | (m << 21));
    } else {
        const uint32_t e = (bits >> 3) & 15u, m = bits & 7u;
        if (e == 15u && m == 7u)
            mag = NAN;
        else if (e == 0u)
            mag = (float)m * 0x1p-9f; /* exact */
        else
            mag = f32_from_bits(((e + 120u) << 23) | (m << 20));
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

/* The portable loops below are compiled at O3 so gcc's vectorizer (not on at -O2 in gcc 12)
 * can work on them. On x86 with SSE4.1 (x86-64-v2 and up) the two hot loops, quantize(+amax)
 * and fake quantize, use hand-written SSE kernels instead: gcc 12 if-converts the portable
 * encoder poorly (it narrows lanes and spills), about 3x slower. Both paths give the same bits;
 * tests/test_fp8_exhaustive.cpp checks the bulk path against the scalar one on every input. */
#define FP8_HOT __attribute__((optimize("O3", "tree-vectorize")))
/* forced, so each (format, saturate) kernel gets its constants folded in */
#define FP8_INLINE static inline __attribute__((always_inline))

#if defined(__SSE4_1__)
#include <smmintrin.h>

/* SSE version of fp8_encode_bits on 4 lanes, magnitude only: the code of |v| (0..0x7F, the
 * overflow code included). Sign and NaN are applied to 16 packed bytes at once, below. */
FP8_INLINE __m128i fp8_encode_mag_sse(__m128i a, fp8_consts c, int saturate) {
    const __m128i lsb = _mm_and_si128(_mm_srli_epi32(a, c.mant_shift), _mm_set1_epi32(1));
    const uint32_t bias_adj =
        ((1u << (c.mant_shift - 1)) - 1u) - ((uint32_t)c.rebias << c.mant_shift);
    const __m128i normal = _mm_srli_epi32(
        _mm_add_epi32(_mm_add_epi32(a, lsb), _mm_set1_epi32((int32_t)bias_adj)), c.mant_shift);
    const __m128 magic = _mm_set1_ps(c.sub_magic);
    const __m128i sub = _mm_sub_epi32(_mm_castps_si128(_mm_add_ps(_mm_castsi128_ps(a), magic)),
                                      _mm_castps_si128(magic));
    const __m128i is_sub = _mm_cmplt_epi32(a, _mm_set1_epi32(c.min_normal));
    const __m128i code = _mm_blendv_epi8(normal, sub, is_sub);
    const __m128i maxc = _mm_set1_epi32(c.max_code);
    if (saturate) return _mm_min_epi32(code, maxc);
    return _mm_blendv_epi8(code, _mm_set1_epi32(c.ovf_nosat), _mm_cmpgt_epi32(code, maxc));
}

/* Narrow 4x4 int32 lanes to 16 bytes with signed saturation: -1 masks stay 0xFF, the sign
 * bit of a float lane becomes 0x80 (negative) or 0x7F (positive). */
FP8_INLINE __m128i pack_s32_to_s8(__m128i a, __m128i b, __m128i c, __m128i d) {
    return _mm_packs_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d));
}

static inline uint32_t hmax_epu32(__m128i m) {
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
    return (uint32_t)_mm_cvtsi128_si32(m);
}

/* 16 elements per step; the tail goes scalar. */
FP8_INLINE uint32_t quant_sse(uint8_t *restrict out, const float *restrict x, size_t n,
                              float scale, fp8_format fmt, int saturate) {
    const fp8_consts c = fp8_consts_of(fmt);
    const __m128 vs = _mm_set1_ps(scale);
    const __m128i absmask = _mm_set1_epi32(0x7FFFFFFF), inf = _mm_set1_epi32(0x7F800000);
    __m128i am = _mm_setzero_si128();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        /* written out 4 times: gcc keeps an array-of-vectors loop on the stack */
        const __m128 x0 = _mm_loadu_ps(x + i), x1 = _mm_loadu_ps(x + i + 4);
        const __m128 x2 = _mm_loadu_ps(x + i + 8), x3 = _mm_loadu_ps(x + i + 12);
        am = _mm_max_epu32(am, _mm_and_si128(_mm_castps_si128(x0), absmask));
        am = _mm_max_epu32(am, _mm_and_si128(_mm_castps_si128(x1), absmask));
        am = _mm_max_epu32(am, _mm_and_si128(_mm_castps_si128(x2), absmask));
        am = _mm_max_epu32(am, _mm_and_si128(_mm_castps_si128(x3), absmask));
        const __m128i u0 = _mm_castps_si128(_mm_mul_ps(x0, vs));
        const __m128i u1 = _mm_castps_si128(_mm_mul_ps(x1, vs));
        const __m128i u2 = _mm_castps_si128(_mm_mul_ps(x2, vs));
        const __m128i u3 = _mm_castps_si128(_mm_mul_ps(x3, vs));
        const __m128i a0 = _mm_and_si128(u0, absmask), a1 = _mm_and_si128(u1, absmask);
        const __m128i a2 = _mm_and_si128(u2, absmask), a3 = _mm_and_si128(u3, absmask);
        const __m128i m01 = _mm_packus_epi32(fp8_encode_mag_sse(a0, c, saturate),
                                             fp8_encode_mag_sse(a1, c, saturate));
        const __m128i m23 = _mm_packus_epi32(fp8_encode_mag_sse(a2, c, saturate),
                                             fp8_encode_mag_sse(a3, c, saturate));
        const __m128i mag = _mm_packus_epi16(m01, m23); /* [16] */
        const __m128i sign = _mm_and_si128(pack_s32_to_s8(u0, u1, u2, u3), _mm_set1_epi8(-128));
        const __m128i nan = pack_s32_to_s8(_mm_cmpgt_epi32(a0, inf), _mm_cmpgt_epi32(a1, inf),
                                           _mm_cmpgt_epi32(a2, inf), _mm_cmpgt_epi32(a3, inf));
        const __m128i code = _mm_blendv_epi8(_mm_or_si128(mag, sign), _mm_set1_epi8(0x7F), nan);
        _mm_storeu_si128((__m128i *)(void *)(out + i), code);
    }
    uint32_t amax_bits = hmax_epu32(am);
    for (; i < n; i++) {
        const uint32_t xa = f32_bits(x[i]) & 0x7FFFFFFFu;
        amax_bits = xa > amax_bits ? xa : amax_bits;
        out[i] = (uint8_t)fp8_encode_bits(f32_bits(x[i] * scale), c, saturate);
    }
    return amax_bits;
}
#define QUANT_LOOP quant_sse
#else
/* Portable version of the same loop. */
FP8_HOT static inline uint32_t quant_c(uint8_t *restrict out, const float *restrict x, size_t n,
                                       float scale, fp8_format fmt, int saturate) {
    const fp8_consts c = fp8_consts_of(fmt);
    uint32_t amax_bits = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t xa = f32_bits(x[i]) & 0x7FFFFFFFu;
        amax_bits = xa > amax_bits ? xa : amax_bits;
        out[i] = (uint8_t)fp8_encode_bits(f32_bits(x[i] * scale), c, saturate);
    }
    return amax_bits;
}
#define QUANT_LOOP quant_c
#endif

/* One kernel per (format, saturate) so all constants fold. Returns the max of |x| as float32
 * bits: for non-negative floats the bit patterns order like the values, and every NaN pattern
 * is above +Inf's, so an integer max is an amax in which NaN wins. */
#define DEFINE_QUANT_KERNEL(NAME, FMT, SAT)                                                      \
    static uint32_t NAME(uint8_t *restrict out, const float *restrict x, size_t n,               \
                         float scale) {                                                          \
        return QUANT_LOOP(out, x, n, scale, FMT, SAT);                                           \
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
static float amax_from_bits(uint32_t bits) {
    return bits > 0x7F800000u ? NAN : f32_from_bits(bits);
}

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

void fp8_dequantize(float *out, const uint8_t *codes, size_t n, float scale_inv, fp8_format fmt) {
    /* [256] decode table with the scale folded in: decode(c) * scale_inv, the same float
     * product the per-element formula gives. Cheap to build next to any tensor worth it. */
    float table[256];
    for (int c = 0; c < 256; c++) table[c] = fp8_decode((uint8_t)c, fmt) * scale_inv;
#pragma omp parallel for schedule(static) if (n >= FP8_OMP_MIN_N)
    for (size_t i = 0; i < n; i++) out[i] = table[codes[i]];
}

/* Quantize-dequantize with saturation: decode(encode(x*scale)) / scale, the division per
 * element to match the formula exactly. Portable path: a [256] table of decoded values. */
#if !defined(__SSE4_1__)
FP8_HOT static void fake_quant_table(float *out, const float *x, size_t n, float scale,
                                     fp8_format fmt, const float *table) {
    const fp8_consts c = fp8_consts_of(fmt);
    for (size_t i = 0; i < n; i++)
        out[i] = table[fp8_encode_bits(f32_bits(x[i] * scale), c, 1)] / scale;
}
#endif

#if defined(__SSE4_1__)
/* SSE path: the rounded value is formed directly as a float, no code in between. Normal
 * range: the same round-to-nearest-even add as the encoder, then clear the dropped mantissa
 * bits; subnormal range: (|v| + magic) - magic, exact; above max: max (as bits, which order
 * like the values); NaN: the quiet NaN fp8_decode gives (0x7FC00000). Then sign, / scale. */
FP8_INLINE void fake_quant_sse(float *out, const float *x, size_t n, float scale,
                               fp8_format fmt) {
    const fp8_consts c = fp8_consts_of(fmt);
    const __m128 vs = _mm_set1_ps(scale), magic = _mm_set1_ps(c.sub_magic);
    const __m128i absmask = _mm_set1_epi32(0x7FFFFFFF), one = _mm_set1_epi32(1);
    const __m128i half_m1 = _mm_set1_epi32((1 << (c.mant_shift - 1)) - 1);
    const __m128i keep = _mm_set1_epi32((int32_t)(0xFFFFFFFFu << c.mant_shift));
    const __m128i min_normal = _mm_set1_epi32(c.min_normal);
    const __m128i max_bits = _mm_set1_epi32((int32_t)f32_bits(fp8_format_max(fmt)));
    const __m128i inf_bits = _mm_set1_epi32(0x7F800000), qnan = _mm_set1_epi32(0x7FC00000);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m128i u = _mm_castps_si128(_mm_mul_ps(_mm_loadu_ps(x + i), vs));
        const __m128i a = _mm_and_si128(u, absmask);
        const __m128i sign = _mm_andnot_si128(absmask, u);
        const __m128i lsb = _mm_and_si128(_mm_srli_epi32(a, c.mant_shift), one);
        const __m128i normal = _mm_and_si128(_mm_add_epi32(_mm_add_epi32(a, half_m1), lsb), keep);
        const __m128 af = _mm_castsi128_ps(a);
        const __m128i sub = _mm_castps_si128(_mm_sub_ps(_mm_add_ps(af, magic), magic));
        __m128i r = _mm_blendv_epi8(normal, sub, _mm_cmpgt_epi32(min_normal, a));
        r = _mm_min_epi32(r, max_bits);
        r = _mm_or_si128(r, sign);
        r = _mm_blendv_epi8(r, qnan, _mm_cmpgt_epi32(a, inf_bits));
        _mm_storeu_ps(out + i, _mm_div_ps(_mm_castsi128_ps(r), vs));
    }
    for (; i < n; i++)
        out[i] = fp8_decode((uint8_t)fp8_encode_bits(f32_bits(x[i] * scale), c, 1), fmt) / scale;
}
#endif

static void fake_quant_kernel(float *out, const float *x, size_t n, float scale, fp8_format fmt,
                              const float *table) {
#if defined(__SSE4_1__)
    (void)table;
    if (fmt == FP8_E5M2)
        fake_quant_sse(out, x, n, scale, FP8_E5M2);
    else
        fake_quant_sse(out, x, n, scale, FP8_E4M3);
#else
    fake_quant_table(out, x, n, scale, fmt, table);
#endif
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

FP8_HOT static void bf16_encode_kernel(uint16_t *out, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = bf16_encode_bits(f32_bits(x[i]));
}

FP8_HOT static void bf16_decode_kernel(float *out, const uint16_t *bits, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = f32_from_bits((uint32_t)bits[i] << 16);
}

void bf16_encode_n(uint16_t *out, const float *x, size_t n) {
    const size_t nchunks = (n + FP8_CHUNK - 1) / FP8_CHUNK;
#pragma omp parallel for schedule(static) if (n >= FP8_OMP_MIN_N)
    for (size_t ch = 0; ch < nchunks; ch++) {
        const size_t lo = ch * FP8_CHUNK, len = n - lo < FP8_CHUNK ? n - lo : FP8_CHUNK;
        bf16_encode_kernel(out + lo, x + lo, len);
    }
}

void bf16_decode_n(float *out, const uint16_t *bits, size_t n) {
    const size_t nchunks = (n + FP8_CHUNK - 1) / FP8_CHUNK;
#pragma omp parallel for schedule(static) if (n >= FP8_OMP_MIN_N)
    for (size_t ch = 0; ch < nchunks; ch++) {
        const size_t lo = ch * FP8_CHUNK, len = n - lo < FP8_CHUNK ? n - lo : FP8_CHUNK;
        bf16_decode_kernel(out + lo, bits + lo, len);
    }
}

void bf16_round(float *out, const float *x, size_t n) {
    const size_t nchunks = (n + FP8_CHUNK - 1) / FP8_CHUNK;
#pragma omp parallel for schedule(static) if (n >= FP8_OMP_MIN_N)
    for (size_t ch = 0; ch < nchunks; ch++) {
        const size_t lo = ch * FP8_CHUNK, len = n - lo < FP8_CHUNK ? n - lo : FP8_CHUNK;
        bf16_round_kernel(out + lo, x + lo, len);
    }
}
