/* fp8train — unit tests of fp8.h: hand-checked encodings at the edges of each format, and the
 * bulk functions against the scalar ones (small and OpenMP-sized inputs, in place, thread
 * count independence). The all-inputs sweep is in test_fp8_exhaustive.cpp. */
#include <float.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "fp8train/fp8.h"
#include "test.h"

static uint32_t u_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float f_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Each row: input, expected code without / with saturation. Worked out by hand from the
 * format definitions (E4M3: bias 7, 3 mantissa bits, max 1.75*2^8; E5M2: bias 15, 2 bits). */
typedef struct {
    float x;
    uint8_t nosat, sat;
} enc_case;

static void check_cases(const enc_case *cs, int n, fp8_format fmt) {
    for (int i = 0; i < n; i++) {
        const uint8_t g0 = fp8_encode(cs[i].x, fmt, 0), g1 = fp8_encode(cs[i].x, fmt, 1);
        T_CHECK(g0 == cs[i].nosat && g1 == cs[i].sat,
                "%s(%.9g): got 0x%02x/0x%02x want 0x%02x/0x%02x", fp8_format_name(fmt),
                (double)cs[i].x, g0, g1, cs[i].nosat, cs[i].sat);
    }
}

static void test_e4m3_hand_values(void) {
    const enc_case cs[] = {
        {0.0f, 0x00, 0x00},
        {-0.0f, 0x80, 0x80},
        {1.0f, 0x38, 0x38},       /* e=7: 0 0111 000 */
        {-2.0f, 0xC0, 0xC0},      /* 1 1000 000 */
        {1.0625f, 0x38, 0x38},    /* halfway 1 / 1.125: tie to even mantissa 000 */
        {1.1875f, 0x3A, 0x3A},    /* halfway 1.125 / 1.25: tie to even 010 */
        {1.06f, 0x38, 0x38},      /* below halfway 1.0625 -> 1 */
        {1.07f, 0x39, 0x39},      /* above halfway -> 1.125 */
        {448.0f, 0x7E, 0x7E},     /* max */
        {464.0f, 0x7E, 0x7E},     /* halfway 448 / (480): tie to even stays 448 */
        {464.00003f, 0x7F, 0x7E}, /* just above: overflow -> NaN / clamp */
        {-1000.0f, 0xFF, 0xFE},   /* negative overflow keeps its sign */
        {0x1p-6f, 0x08, 0x08},    /* smallest normal */
        {0x1p-9f, 0x01, 0x01},    /* smallest subnormal */
        {0x1p-10f, 0x00, 0x00},   /* half of it: tie to even -> 0 */
        {0x1.8p-10f, 0x01, 0x01}, /* 0.75 of a step -> 1 step */
        {0x1.8p-9f, 0x02, 0x02},  /* 1.5 steps: tie to even -> 2 */
        {0x1.Ep-7f, 0x08, 0x08},  /* 7.5 steps: tie to even -> 8 = smallest normal */
        {-0x1p-11f, 0x80, 0x80},  /* underflow keeps the sign */
        {INFINITY, 0x7F, 0x7E},
        {-INFINITY, 0xFF, 0xFE},
        {NAN, 0x7F, 0x7F},
        {-NAN, 0x7F, 0x7F}, /* NaN sign dropped, as the CUDA toolkit does */
    };
    check_cases(cs, (int)(sizeof cs / sizeof cs[0]), FP8_E4M3);
}

static void test_e5m2_hand_values(void) {
    const enc_case cs[] = {
        {1.0f, 0x3C, 0x3C},       /* e=15: 0 01111 00 */
        {1.125f, 0x3C, 0x3C},     /* halfway 1 / 1.25: tie to even */
        {1.375f, 0x3E, 0x3E},     /* halfway 1.25 / 1.5: tie to even 10 */
        {57344.0f, 0x7B, 0x7B},   /* max */
        {61439.996f, 0x7B, 0x7B}, /* just below halfway max / 2^16 */
        {61440.0f, 0x7C, 0x7B},   /* halfway: ties to even = Inf -> Inf / clamp */
        {-1e10f, 0xFC, 0xFB},
        {INFINITY, 0x7C, 0x7B}, /* Inf input saturates to max, like the toolkit */
        {-INFINITY, 0xFC, 0xFB},
        {0x1p-14f, 0x04, 0x04}, /* smallest normal */
        {0x1p-16f, 0x01, 0x01}, /* smallest subnormal */
        {0x1p-17f, 0x00, 0x00}, /* tie -> 0 */
        {-0x1.0002p-17f, 0x81, 0x81},
        {NAN, 0x7F, 0x7F},
    };
    check_cases(cs, (int)(sizeof cs / sizeof cs[0]), FP8_E5M2);
}

static void test_decode_hand_values(void) {
    T_CHECK(fp8_decode(0x38, FP8_E4M3) == 1.0f, "e4m3 1");
    T_CHECK(fp8_decode(0xFE, FP8_E4M3) == -448.0f, "e4m3 -max");
    T_CHECK(fp8_decode(0x07, FP8_E4M3) == 7 * 0x1p-9f, "e4m3 subnormal");
    T_CHECK(isnan(fp8_decode(0x7F, FP8_E4M3)) && isnan(fp8_decode(0xFF, FP8_E4M3)), "e4m3 NaN");
    T_CHECK(fp8_decode(0x78, FP8_E4M3) == 256.0f, "e4m3 0x78 is finite (fn variant)");
    T_CHECK(fp8_decode(0x7C, FP8_E5M2) == INFINITY && fp8_decode(0xFC, FP8_E5M2) == -INFINITY,
            "e5m2 Inf");
    T_CHECK(isnan(fp8_decode(0x7D, FP8_E5M2)), "e5m2 NaN");
    T_CHECK(u_of(fp8_decode(0x80, FP8_E5M2)) == 0x80000000u, "e5m2 -0");
    T_CHECK(fp8_format_max(FP8_E4M3) == 448.0f && fp8_format_max(FP8_E5M2) == 57344.0f, "max");
    T_CHECK(!strcmp(fp8_format_name(FP8_E4M3), "e4m3") &&
                !strcmp(fp8_format_name(FP8_E5M2), "e5m2"),
            "names");
}

static void test_bf16_hand_values(void) {
    const struct {
        float x;
        uint16_t want;
    } cs[] = {
        {1.0f, 0x3F80},
        {1.0f + 0x1p-8f, 0x3F80},   /* tie to even */
        {1.0f + 0x3p-8f, 0x3F82},   /* tie to even (up) */
        {1.0f + 0x1.2p-8f, 0x3F81}, /* above halfway */
        {-0.0f, 0x8000},
        {FLT_MAX, 0x7F80},     /* rounds up to Inf */
        {0x1.FEp127f, 0x7F7F}, /* largest finite bf16 */
        {0x1p-133f, 0x0001},   /* smallest bf16 subnormal */
        {0x1p-149f, 0x0000},   /* float's smallest subnormal underflows */
        {-INFINITY, 0xFF80},
        {NAN, 0x7FFF},
        {-NAN, 0x7FFF},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        T_CHECK(bf16_encode(cs[i].x) == cs[i].want, "bf16(%.9g) = 0x%04x want 0x%04x",
                (double)cs[i].x, bf16_encode(cs[i].x), cs[i].want);
    T_CHECK(bf16_decode(0x3F80) == 1.0f && bf16_decode(0xC000) == -2.0f, "bf16 decode");
}

/* ---- bulk vs scalar ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* Values over a wide range of magnitudes, with some exact zeros and specials sprinkled in. */
static void fill_test_data(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const uint32_t r = rng_u32();
        const float mant = 1.0f + (float)(r & 0xFFFF) / 65536.0f;
        const int e = (int)((r >> 16) % 48) - 28; /* 2^-28 .. 2^19 */
        float v = ldexpf(mant, e);
        if (r >> 31) v = -v;
        if (i % 997 == 5) v = 0.0f;
        if (i % 1999 == 7) v = -0.0f;
        x[i] = v;
    }
}

static void check_bulk_matches_scalar(size_t n) {
    float *x = malloc(n * sizeof *x); /* [n] */
    uint8_t *q = malloc(n);           /* [n] */
    float *y = malloc(n * sizeof *y); /* [n] */
    T_ASSERT(x && q && y, "out of memory");
    fill_test_data(x, n);
    const float scales[3] = {1.0f, 0.37f, 1024.0f};
    for (int fm = 0; fm < 2; fm++)
        for (int sat = 0; sat < 2; sat++)
            for (int k = 0; k < 3; k++) {
                const float s = scales[k];
                const float am = fp8_quantize_amax(q, x, n, s, (fp8_format)fm, sat);
                float want_am = 0.0f;
                size_t bad = 0;
                for (size_t i = 0; i < n; i++) {
                    bad += q[i] != fp8_encode(x[i] * s, (fp8_format)fm, sat);
                    if (fabsf(x[i]) > want_am) want_am = fabsf(x[i]);
                }
                T_CHECK(bad == 0, "quantize_amax n=%zu %s sat=%d scale=%g: %zu codes differ", n,
                        fp8_format_name(fm), sat, (double)s, bad);
                T_CHECK(am == want_am, "amax %g want %g", (double)am, (double)want_am);
                memset(q, 0xAA, n);
                fp8_quantize(q, x, n, s, (fp8_format)fm, sat);
                bad = 0;
                for (size_t i = 0; i < n; i++)
                    bad += q[i] != fp8_encode(x[i] * s, (fp8_format)fm, sat);
                T_CHECK(bad == 0, "quantize n=%zu: %zu codes differ", n, bad);
                /* dequantize: decode(c) * scale_inv */
                fp8_dequantize(y, q, n, 1.0f / s, (fp8_format)fm);
                bad = 0;
                for (size_t i = 0; i < n; i++)
                    bad += u_of(y[i]) != u_of(fp8_decode(q[i], (fp8_format)fm) * (1.0f / s));
                T_CHECK(bad == 0, "dequantize n=%zu: %zu values differ", n, bad);
            }
    /* fake quantize, out of place then in place */
    for (int fm = 0; fm < 2; fm++) {
        const float s = 3.0f;
        fp8_fake_quantize(y, x, n, s, (fp8_format)fm);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += u_of(y[i]) !=
                   u_of(fp8_decode(fp8_encode(x[i] * s, (fp8_format)fm, 1), (fp8_format)fm) / s);
        T_CHECK(bad == 0, "fake_quantize n=%zu: %zu differ", n, bad);
        float *z = malloc(n * sizeof *z);
        T_ASSERT(z, "out of memory");
        memcpy(z, x, n * sizeof *z);
        fp8_fake_quantize(z, z, n, s, (fp8_format)fm);
        T_CHECK(!memcmp(z, y, n * sizeof *z), "fake_quantize in place differs");
        free(z);
    }
    /* bf16_round, out of place and in place */
    bf16_round(y, x, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += u_of(y[i]) != ((uint32_t)bf16_encode(x[i]) << 16);
    T_CHECK(bad == 0, "bf16_round n=%zu: %zu differ", n, bad);
    memcpy(y, x, n * sizeof *y);
    bf16_round(y, y, n);
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += u_of(y[i]) != ((uint32_t)bf16_encode(x[i]) << 16);
    T_CHECK(bad == 0, "bf16_round in place: %zu differ", bad);
    /* bf16_encode_n / bf16_decode_n against the scalar conversions */
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    T_ASSERT(h, "out of memory");
    bf16_encode_n(h, x, n);
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += h[i] != bf16_encode(x[i]);
    T_CHECK(bad == 0, "bf16_encode_n n=%zu: %zu differ", n, bad);
    bf16_decode_n(y, h, n);
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += u_of(y[i]) != u_of(bf16_decode(h[i]));
    T_CHECK(bad == 0, "bf16_decode_n n=%zu: %zu differ", n, bad);
    free(h);
    free(x), free(q), free(y);
}

static void test_bulk_small(void) {
    check_bulk_matches_scalar(1);
    check_bulk_matches_scalar(37);
    check_bulk_matches_scalar(4099);
}

static void test_bulk_large_threaded(void) { check_bulk_matches_scalar(300007); }

static void test_amax_special_values(void) {
    T_CHECK(fp8_amax(NULL, 0) == 0.0f, "empty amax is 0");
    static float x[200003];
    const size_t n = sizeof x / sizeof x[0];
    for (size_t i = 0; i < n; i++) x[i] = (float)(i % 1000) * (i & 1 ? -0.5f : 0.5f);
    T_CHECK(fp8_amax(x, n) == 499.5f, "amax %g", (double)fp8_amax(x, n));
    x[n - 1] = -INFINITY;
    T_CHECK(fp8_amax(x, n) == INFINITY, "-Inf gives amax Inf");
    x[12345] = f_of(0xFFC00001u); /* a negative NaN with a payload */
    T_CHECK(isnan(fp8_amax(x, n)), "NaN anywhere gives NaN");
    T_CHECK(isnan(fp8_amax(x + 12345, 1)), "single NaN");
    uint8_t q[64];
    float small[3] = {1.0f, NAN, 2.0f};
    T_CHECK(isnan(fp8_quantize_amax(q, small, 3, 1.0f, FP8_E4M3, 1)), "quantize_amax NaN");
    T_CHECK(q[1] == 0x7F && q[0] == 0x38, "codes around the NaN");
}

/* Threads split the work but never change a bit: 1 thread vs the default. */
static void test_thread_count_independent(void) {
    const size_t n = 1 << 19;
    float *x = malloc(n * sizeof *x), *y1 = malloc(n * sizeof *y1), *y2 = malloc(n * sizeof *y2);
    uint8_t *q1 = malloc(n), *q2 = malloc(n);
    T_ASSERT(x && y1 && y2 && q1 && q2, "out of memory");
    fill_test_data(x, n);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const float a1 = fp8_quantize_amax(q1, x, n, 0.5f, FP8_E5M2, 1);
    fp8_fake_quantize(y1, x, n, 7.0f, FP8_E4M3);
    omp_set_num_threads(saved > 1 ? saved : 2);
    const float a2 = fp8_quantize_amax(q2, x, n, 0.5f, FP8_E5M2, 1);
    fp8_fake_quantize(y2, x, n, 7.0f, FP8_E4M3);
    omp_set_num_threads(saved);
    T_CHECK(a1 == a2 && !memcmp(q1, q2, n) && !memcmp(y1, y2, n * sizeof *y1),
            "results depend on the thread count");
    free(x), free(y1), free(y2), free(q1), free(q2);
}

int main(void) {
    t_suite = "fp8";
    T_RUN(test_e4m3_hand_values);
    T_RUN(test_e5m2_hand_values);
    T_RUN(test_decode_hand_values);
    T_RUN(test_bf16_hand_values);
    T_RUN(test_bulk_small);
    T_RUN(test_bulk_large_threaded);
    T_RUN(test_amax_special_values);
    T_RUN(test_thread_count_independent);
    T_MAIN_END();
}
