/* fp8train — scaling recipe tests. Every expected scale and code below was worked out by hand
 * from the formulas in recipe.h (E4M3 max 448, E5M2 max 57344) and is written out literally. */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>

#include "fp8train/recipe.h"
#include "test.h"

static void test_state_layout(void) {
    T_CHECK(fp8t_recipe_state_floats(3, 4) == 21, "(len+3)*n = 21, got %zu",
            fp8t_recipe_state_floats(3, 4));
    float base[21];
    fp8t_recipe_state st;
    fp8t_recipe_state_view(&st, base, 3, 4);
    T_CHECK(st.history == base && st.scale == base + 12 && st.scale_inv == base + 15 &&
                st.fmt_max == base + 18 && st.n == 3 && st.len == 4,
            "views into the flat state");
    const fp8_format fmts[3] = {FP8_E4M3, FP8_E5M2, FP8_E4M3};
    for (int i = 0; i < 21; i++) base[i] = -7.0f;
    fp8t_recipe_state_reset(&st, fmts);
    for (int i = 0; i < 12; i++) T_CHECK(base[i] == 0.0f, "history[%d] = %g", i, (double)base[i]);
    T_CHECK(st.scale[0] == 1 && st.scale[1] == 1 && st.scale[2] == 1, "scale 1");
    T_CHECK(st.scale_inv[0] == 1 && st.scale_inv[1] == 1 && st.scale_inv[2] == 1, "scale_inv 1");
    T_CHECK(st.fmt_max[0] == 448 && st.fmt_max[1] == 57344 && st.fmt_max[2] == 448, "fmt_max");
    fp8t_recipe_state_reset(&st, NULL);
    T_CHECK(st.fmt_max[1] == 448, "NULL fmts means E4M3");
}

static void test_delayed_scale_formula(void) {
    T_CHECK(fp8t_delayed_scale(2.0f, 5.0f, 448.0f, 0) == 224.0f, "448/2");
    T_CHECK(fp8t_delayed_scale(2.0f, 5.0f, 448.0f, 1) == 112.0f, "margin 1 halves");
    T_CHECK(fp8t_delayed_scale(2.0f, 5.0f, 448.0f, 2) == 56.0f, "margin 2 quarters");
    T_CHECK(fp8t_delayed_scale(448.0f, 5.0f, 448.0f, 0) == 1.0f, "amax = max");
    T_CHECK(fp8t_delayed_scale(1000.0f, 5.0f, 57344.0f, 0) == 57.344f, "e5m2");
    T_CHECK(fp8t_delayed_scale(0.0f, 5.0f, 448.0f, 0) == 5.0f, "amax 0 keeps the scale");
    T_CHECK(fp8t_delayed_scale(INFINITY, 5.0f, 448.0f, 0) == 5.0f, "amax Inf keeps the scale");
    T_CHECK(fp8t_delayed_scale(NAN, 5.0f, 448.0f, 0) == 5.0f, "amax NaN keeps the scale");
    T_CHECK(fp8t_delayed_scale(0x1p-140f, 5.0f, 448.0f, 0) == FLT_MAX,
            "448 / 2^-140 overflows float: FLT_MAX");
}

static void record_and_update(fp8t_recipe_state *st, const float *amaxes, int k,
                              fp8t_amax_algo algo, int margin) {
    for (int i = 0; i < k; i++) fp8t_recipe_record_amax(st, 0, amaxes[i]);
    fp8t_delayed_update(st, algo, margin);
}

/* One tensor, history length 3. Step amaxes 4 | 2,1 | 1 | 0.5 | 0.25 | - | - | -.
 * History after each update ([slot0, slot1, slot2], slot0 zeroed by the roll):
 *   [0,0,4] [0,4,2] [0,2,1] [0,1,.5] [0,.5,.25] [0,.25,0] [0,0,0] [0,0,0]
 * algo max:         the max over the window before the roll:
 *   4 4 4 2 1 .5 .25 0  ->  scales 112 112 112 224 448 896 1792 1792(kept)
 * algo most_recent: slot0 before the roll:
 *   4 2 1 .5 .25 0 ...  ->  scales 112 224 448 896 1792 1792(kept) */
static void test_delayed_history_window(void) {
    float base[6];
    fp8t_recipe_state st;
    fp8t_recipe_state_view(&st, base, 1, 3);
    fp8t_recipe_state_reset(&st, NULL);
    const float steps[8][2] = {{4, 0},     {2, 1}, {1, 0}, {0.5f, 0},
                               {0.25f, 0}, {0, 0}, {0, 0}, {0, 0}};
    const float want_max[8] = {112, 112, 112, 224, 448, 896, 1792, 1792};
    const float want_hist[8][3] = {{0, 0, 4},        {0, 4, 2},     {0, 2, 1}, {0, 1, 0.5f},
                                   {0, 0.5f, 0.25f}, {0, 0.25f, 0}, {0, 0, 0}, {0, 0, 0}};
    for (int s = 0; s < 8; s++) {
        if (s == 1) T_CHECK(fp8t_recipe_history_max(&st, 0) == 4.0f, "history max before step 2");
        record_and_update(&st, steps[s], 2, FP8T_AMAX_MAX, 0);
        T_CHECK(st.scale[0] == want_max[s], "max: step %d scale %g want %g", s + 1,
                (double)st.scale[0], (double)want_max[s]);
        T_CHECK(st.scale_inv[0] == 1.0f / want_max[s], "scale_inv step %d", s + 1);
        for (int i = 0; i < 3; i++)
            T_CHECK(st.history[i] == want_hist[s][i], "step %d history[%d] = %g want %g", s + 1,
                    i, (double)st.history[i], (double)want_hist[s][i]);
    }
    fp8t_recipe_state_reset(&st, NULL);
    const float want_recent[8] = {112, 224, 448, 896, 1792, 1792, 1792, 1792};
    for (int s = 0; s < 8; s++) {
        record_and_update(&st, steps[s], 2, FP8T_AMAX_MOST_RECENT, 0);
        T_CHECK(st.scale[0] == want_recent[s], "most_recent: step %d scale %g want %g", s + 1,
                (double)st.scale[0], (double)want_recent[s]);
    }
    /* margin 1 halves every scale: first step 448/4/2 = 56 */
    fp8t_recipe_state_reset(&st, NULL);
    record_and_update(&st, steps[0], 1, FP8T_AMAX_MAX, 1);
    T_CHECK(st.scale[0] == 56.0f, "margin 1: %g", (double)st.scale[0]);
}

/* Two tensors (E4M3, E5M2), history length 2; history is [len][n] = [slot][tensor].
 *   step 1: amax 4, 8      -> scales 112, 7168; history after roll [0,0, 4,8]
 *   step 2: amax NaN, Inf  -> NaN skipped (TE's fmaxf): window max 4 -> 112; Inf kept
 *                             (7168); history [0,0, NaN,Inf]
 *   step 3: amax 1, 1      -> tensor 0: NaN skipped, max 1 -> 448 (a NaN does not freeze
 *                             the scale); tensor 1: Inf still in the window, kept; [0,0, 1,1]
 *   step 4: nothing        -> window max 1, 1: scales 448, 57344
 *   step 5: amax 2^-140    -> 448/2^-140 is Inf in float: FLT_MAX */
static void test_delayed_nonfinite_and_layout(void) {
    float base[10];
    fp8t_recipe_state st;
    fp8t_recipe_state_view(&st, base, 2, 2);
    const fp8_format fmts[2] = {FP8_E4M3, FP8_E5M2};
    fp8t_recipe_state_reset(&st, fmts);

    fp8t_recipe_record_amax(&st, 0, 4.0f);
    fp8t_recipe_record_amax(&st, 1, 8.0f);
    fp8t_delayed_update(&st, FP8T_AMAX_MAX, 0);
    T_CHECK(st.scale[0] == 112.0f && st.scale[1] == 7168.0f, "step 1: %g %g", (double)st.scale[0],
            (double)st.scale[1]);
    T_CHECK(base[0] == 0 && base[1] == 0 && base[2] == 4 && base[3] == 8, "step 1 history");

    fp8t_recipe_record_amax(&st, 0, NAN);
    fp8t_recipe_record_amax(&st, 0, 3.0f); /* NaN already there wins */
    fp8t_recipe_record_amax(&st, 1, INFINITY);
    T_CHECK(isnan(st.history[0]) && isinf(st.history[1]), "NaN wins in slot 0");
    T_CHECK(fp8t_recipe_history_max(&st, 0) == 4.0f, "history max skips the NaN: %g",
            (double)fp8t_recipe_history_max(&st, 0));
    fp8t_delayed_update(&st, FP8T_AMAX_MAX, 0);
    T_CHECK(st.scale[0] == 112.0f && st.scale[1] == 7168.0f, "step 2 kept: %g %g",
            (double)st.scale[0], (double)st.scale[1]);
    T_CHECK(base[0] == 0 && base[1] == 0 && isnan(base[2]) && isinf(base[3]), "step 2 history");

    fp8t_recipe_record_amax(&st, 0, 1.0f);
    fp8t_recipe_record_amax(&st, 1, 1.0f);
    fp8t_delayed_update(&st, FP8T_AMAX_MAX, 0);
    T_CHECK(st.scale[0] == 448.0f && st.scale[1] == 7168.0f,
            "step 3: NaN skipped, Inf kept: %g %g", (double)st.scale[0], (double)st.scale[1]);
    T_CHECK(base[2] == 1 && base[3] == 1, "step 3 history");

    fp8t_delayed_update(&st, FP8T_AMAX_MAX, 0);
    T_CHECK(st.scale[0] == 448.0f && st.scale[1] == 57344.0f, "step 4: %g %g",
            (double)st.scale[0], (double)st.scale[1]);
    T_CHECK(st.scale_inv[0] == 1.0f / 448.0f && st.scale_inv[1] == 1.0f / 57344.0f, "scale_inv");

    fp8t_recipe_record_amax(&st, 0, 0x1p-140f);
    fp8t_delayed_update(&st, FP8T_AMAX_MOST_RECENT, 0);
    T_CHECK(st.scale[0] == FLT_MAX, "Inf scale becomes FLT_MAX: %g", (double)st.scale[0]);
    T_CHECK(st.scale[1] == 57344.0f, "most_recent amax 0 keeps the scale");
}

static void test_current_scale_formula(void) {
    T_CHECK(fp8t_current_scale(2.0f, 448.0f, 0.0f, 0) == 224.0f, "448/2");
    T_CHECK(fp8t_current_scale(3.0f, 448.0f, 0.0f, 0) == 0x1.2AAAAAp+7f, "448/3 rounded");
    T_CHECK(fp8t_current_scale(3.0f, 448.0f, 0.0f, 1) == 128.0f, "149.3 -> 128");
    T_CHECK(fp8t_current_scale(2.0f, 448.0f, 0.0f, 1) == 128.0f, "224 -> 128");
    T_CHECK(fp8t_current_scale(7.0f, 448.0f, 0.0f, 1) == 64.0f, "64 stays 64");
    T_CHECK(fp8t_current_scale(1000.0f, 57344.0f, 0.0f, 1) == 32.0f, "57.344 -> 32");
    T_CHECK(fp8t_current_scale(0.25f, 448.0f, 0.5f, 0) == 896.0f, "epsilon clamps amax up");
    T_CHECK(fp8t_current_scale(1.0f, 448.0f, 0.5f, 0) == 448.0f, "epsilon below amax: no effect");
    T_CHECK(fp8t_current_scale(0.0f, 448.0f, 0.5f, 0) == 896.0f, "amax 0 with epsilon");
    T_CHECK(fp8t_current_scale(0.0f, 448.0f, 0.0f, 0) == 1.0f, "amax 0 -> 1");
    T_CHECK(fp8t_current_scale(INFINITY, 448.0f, 0.0f, 1) == 1.0f, "Inf -> 1");
    T_CHECK(fp8t_current_scale(NAN, 448.0f, 0.5f, 0) == 1.0f, "NaN -> 1 even with epsilon");
    T_CHECK(fp8t_current_scale(0x1p-140f, 448.0f, 0.0f, 0) == FLT_MAX, "overflow -> FLT_MAX");
    T_CHECK(fp8t_current_scale(0x1p-140f, 448.0f, 0.0f, 1) == 0x1p127f, "FLT_MAX pow2 -> 2^127");
}

/* x [2, 4], 1x2 tiles, E4M3:
 *   row 0: [1, -2 | 0.5, 0.25]  amax 2, 0.5   -> scales 224, 896
 *   row 1: [0, 0  | 100, -896]  amax 0, 896   -> scales 1, 0.5
 * codes: 1*224=224 -> 0x76, -448 -> 0xFE | 448 -> 0x7E, 224 -> 0x76
 *        0, 0 | 100*0.5 = 50 is halfway 48/52 -> 48 = 0x64, -448 -> 0xFE
 * dequantized: 1, -2, 0.5, 0.25, 0, 0, 96, -896 */
static void test_block_quantize_hand(void) {
    const float x[8] = {1, -2, 0.5f, 0.25f, 0, 0, 100, -896};
    uint8_t codes[8];
    float scales[4], y[8];
    fp8t_block_quantize(codes, scales, x, 2, 4, 1, 2, FP8_E4M3);
    const float want_s[4] = {224, 896, 1, 0.5f};
    const uint8_t want_c[8] = {0x76, 0xFE, 0x7E, 0x76, 0x00, 0x00, 0x64, 0xFE};
    const float want_y[8] = {1, -2, 0.5f, 0.25f, 0, 0, 96, -896};
    for (int i = 0; i < 4; i++)
        T_CHECK(scales[i] == want_s[i], "scale[%d] = %g", i, (double)scales[i]);
    for (int i = 0; i < 8; i++) T_CHECK(codes[i] == want_c[i], "code[%d] = 0x%02x", i, codes[i]);
    fp8t_block_dequantize(y, codes, scales, 2, 4, 1, 2, FP8_E4M3);
    for (int i = 0; i < 8; i++) T_CHECK(y[i] == want_y[i], "y[%d] = %g", i, (double)y[i]);
}

/* x [130, 200] with 128x128 blocks: 2x2 blocks, the edge ones partial (2 rows, 72 cols).
 * Each block holds values m/8 * 2^k (m = 8..15) times its own power of two, with one element set
 * to the block's amax: 7, 3.5, 448, and block (1,1) all zero. Scales: 64, 128, 1, 1 — and
 * since every value is then exactly representable, the round trip is exact. */
static void test_block_128x128_partial_edges(void) {
    const int rows = 130, cols = 200;
    float *x = malloc(sizeof(float) * rows * cols), *y = malloc(sizeof(float) * rows * cols);
    uint8_t *codes = malloc((size_t)rows * cols);
    T_ASSERT(x && y && codes, "out of memory");
    const float unit[4] = {1.0f / 64, 1.0f / 128, 1.0f, 0.0f}; /* block (br, bc) -> br*2+bc */
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const int b = (r / 128) * 2 + c / 128, i = r * cols + c;
            x[i] = unit[b] * (float)(8 + (r + c) % 8) / 8.0f * (float)(1 << ((r * 7 + c) % 5));
            if ((r + c) % 3 == 0) x[i] = -x[i];
        }
    x[5 * cols + 6] = 7.0f, x[100 * cols + 150] = -3.5f, x[129 * cols + 1] = 448.0f;
    float scales[4];
    fp8t_block_quantize(codes, scales, x, rows, cols, 128, 128, FP8_E4M3);
    T_CHECK(scales[0] == 64.0f && scales[1] == 128.0f && scales[2] == 1.0f && scales[3] == 1.0f,
            "scales %g %g %g %g", (double)scales[0], (double)scales[1], (double)scales[2],
            (double)scales[3]);
    fp8t_block_dequantize(y, codes, scales, rows, cols, 128, 128, FP8_E4M3);
    size_t bad = 0;
    for (int i = 0; i < rows * cols; i++) bad += y[i] != x[i];
    T_CHECK(bad == 0, "%zu elements not exact after the round trip", bad);
    free(x), free(y), free(codes);
}

static uint64_t rng = 88172645463325252ull;
static float rnd_normalish(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    const double u = (double)(rng >> 11) / 9007199254740992.0;
    return (float)((u - 0.5) * 8.0 * ((rng & 15) == 0 ? 100.0 : 1.0)); /* some outliers */
}

/* 1x128 tiles on [3, 300] random data (blocks of 128, 128, 44 per row): every element's
 * error is within half an E4M3 step of its block: |y - x| <= |x|/16 + 2^-10/scale. */
static void test_block_1x128_round_trip(void) {
    enum { R = 3, C = 300, NB = 3 };
    static float x[R * C], y[R * C];
    static uint8_t codes[R * C];
    float scales[R * NB];
    for (int i = 0; i < R * C; i++) x[i] = rnd_normalish();
    fp8t_block_quantize(codes, scales, x, R, C, 1, 128, FP8_E4M3);
    fp8t_block_dequantize(y, codes, scales, R, C, 1, 128, FP8_E4M3);
    for (int r = 0; r < R; r++)
        for (int b = 0; b < NB; b++) {
            float amax = 0;
            for (int c = b * 128; c < C && c < (b + 1) * 128; c++)
                amax = fmaxf(amax, fabsf(x[r * C + c]));
            T_CHECK(scales[r * NB + b] == 448.0f / amax, "block (%d,%d) scale", r, b);
        }
    for (int i = 0; i < R * C; i++) {
        const float s = scales[(i / C) * NB + (i % C) / 128];
        T_CHECK(fabsf(y[i] - x[i]) <= fabsf(x[i]) / 16 + 0x1p-10f / s, "x[%d] = %g -> %g", i,
                (double)x[i], (double)y[i]);
    }
}

/* MXFP8, x [2, 40]: blocks cols 0..31 and 32..39 (partial).
 *   row 0 block 0: 1, -0.5, zeros   amax 1:   e = ceil(log2(1/448)) = ceil(-8.81) = -8 -> 119
 *                  codes 1*256 = 256 -> 0x78, -128 -> 0xF0
 *   row 0 block 1: 449, 3, zeros    amax 449: e = ceil(log2(449/448)) = 1 -> 128
 *                  codes 224.5 -> 224 = 0x76, 1.5 -> 0x3C; dequantized 448, 3
 *   row 1 block 0: zeros            amax 0 -> 127, codes 0
 *   row 1 block 1: a NaN            -> 0xFF (NaN scale), every code 0x7F, dequantized NaN */
static void test_mxfp8_hand(void) {
    float x[80] = {0};
    x[0] = 1.0f, x[1] = -0.5f, x[32] = 449.0f, x[33] = 3.0f, x[40 + 35] = NAN;
    uint8_t codes[80], e8[4];
    float y[80];
    fp8t_mxfp8_quantize(codes, e8, x, 2, 40);
    T_CHECK(e8[0] == 119 && e8[1] == 128 && e8[2] == 127 && e8[3] == 0xFF, "e8m0 %d %d %d %d",
            e8[0], e8[1], e8[2], e8[3]);
    T_CHECK(codes[0] == 0x78 && codes[1] == 0xF0 && codes[2] == 0x00, "row 0 block 0 codes");
    T_CHECK(codes[32] == 0x76 && codes[33] == 0x3C && codes[39] == 0x00, "row 0 block 1 codes");
    T_CHECK(codes[40 + 32] == 0x7F && codes[40 + 39] == 0x7F, "NaN block codes");
    fp8t_mxfp8_dequantize(y, codes, e8, 2, 40);
    T_CHECK(y[0] == 1.0f && y[1] == -0.5f && y[2] == 0.0f && y[32] == 448.0f && y[33] == 3.0f,
            "row 0 dequantized %g %g %g %g", (double)y[0], (double)y[1], (double)y[32],
            (double)y[33]);
    T_CHECK(y[40] == 0.0f && isnan(y[40 + 32]) && isnan(y[79]), "row 1 dequantized");

    /* exact power-of-two ratios: amax 448 -> 2^0 (127), 224 -> 2^-1 (126), 896 -> 2^1 (128);
     * 2^-140 would need 2^-149: clamped to 2^-127 (0) */
    const float am[4] = {448.0f, 224.0f, 896.0f, 0x1p-140f};
    const uint8_t want[4] = {127, 126, 128, 0};
    for (int k = 0; k < 4; k++) {
        uint8_t c, e;
        fp8t_mxfp8_quantize(&c, &e, &am[k], 1, 1);
        T_CHECK(e == want[k], "amax %g -> e8m0 %d want %d", (double)am[k], e, want[k]);
    }
}

/* Random [4, 100] round trip: within half an E4M3 step of each block's scale. */
static void test_mxfp8_round_trip(void) {
    enum { R = 4, C = 100, NB = 4 };
    float x[R * C], y[R * C];
    uint8_t codes[R * C], e8[R * NB];
    for (int i = 0; i < R * C; i++) x[i] = rnd_normalish() * 1e-3f;
    fp8t_mxfp8_quantize(codes, e8, x, R, C);
    fp8t_mxfp8_dequantize(y, codes, e8, R, C);
    for (int i = 0; i < R * C; i++) {
        const float s = ldexpf(1.0f, e8[(i / C) * NB + (i % C) / 32] - 127);
        T_CHECK(fabsf(y[i] - x[i]) <= fabsf(x[i]) / 16 + 0x1p-10f * s, "x[%d] = %g -> %g", i,
                (double)x[i], (double)y[i]);
        T_CHECK(fabsf(x[i]) / s <= 448.0f, "block scale too small at %d", i);
    }
}

static void test_bad_shapes_do_not_crash(void) {
    uint8_t codes[4] = {9, 9, 9, 9};
    float scales[1] = {-1}, x[4] = {1, 2, 3, 4};
    fp8t_block_quantize(codes, scales, x, 2, 2, 0, 128, FP8_E4M3); /* prints an error */
    T_CHECK(codes[0] == 9 && scales[0] == -1, "nothing written for a zero tile");
}

int main(void) {
    t_suite = "recipe";
    T_RUN(test_state_layout);
    T_RUN(test_delayed_scale_formula);
    T_RUN(test_delayed_history_window);
    T_RUN(test_delayed_nonfinite_and_layout);
    T_RUN(test_current_scale_formula);
    T_RUN(test_block_quantize_hand);
    T_RUN(test_block_128x128_partial_edges);
    T_RUN(test_block_1x128_round_trip);
    T_RUN(test_mxfp8_hand);
    T_RUN(test_mxfp8_round_trip);
    T_RUN(test_bad_shapes_do_not_crash);
    T_MAIN_END();
}
