/* Tests of the CPU backend's BF16 operands (include/fp8train/backend.h):
 *  - to_bf16 (make_operand's BF16 operand of x, operand_ops.h): every element equals
 *    bf16_encode (round to nearest even, NaN, Inf, signed zero, subnormals, ties with an even
 *    and an odd lower neighbour, FLT_MAX), stored with padded rows and columns whose padding
 *    is zeroed even over a buffer full of 0xFF, nothing written past fp8t_bf16_bytes, the amax
 *    max-accumulated bit for bit like the amax op (NaN wins).
 *  - gemm_bf16_rounded: bit for bit gemm_bf16 on the same FP32 tensors (the contract: gemm_bf16
 *    is the BF16 operands of both, then this) in every transA/transB/acc combination, with a
 *    bias bit for bit gemm_bf16 followed by bias_add, and the degenerate sizes (K = 0, M = 0,
 *    N = 0) as gemm_bf16 treats them; with a row stride ldc > N, the same bits in the first N
 *    columns of each row, the columns past pad8(N) untouched, those in between zero or untouched.
 *  - softmax_xent_bf16: bit for bit softmax_xent then to_bf16 (losses, operand, amax), logits
 *    rows with a stride past V, ignored targets, NaN logits, dloss folded in. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/backend.h"
#include "fp8train/fp8.h"
#include "operand_ops.h"
#include "test.h"
#define TEST_RNG_SEED 0x243F6A8885A308D3ull /* this test's own sequence */
#include "test_rng.h"

static fp8t_backend *be;
#define OPS (be->ops)

/* ---- helpers ---- */

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Values over many binades (|x| from 2^-20 to 2^20, either sign), plus a quarter of them
 * with random low mantissa bits set so every rounding direction occurs. */
static float rand_value(void) {
    float x = (float)ldexp(rng_uniform() * 2.0 - 1.0, rng_int(41) - 20);
    if (rng_int(4) == 0) x = f32_from_bits(f32_bits(x) ^ (uint32_t)(rng_next() & 0xFFFFu));
    return x;
}

/* backend buffer of `bytes` bytes holding a copy of host memory (through to_device) */
static void *dev_upload(const void *host, size_t bytes) {
    void *d = OPS->malloc(be, bytes);
    if (bytes) OPS->to_device(be, d, host, bytes);
    return d;
}
static void *host_download(const void *dev, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    if (bytes) OPS->to_host(be, h, dev, bytes);
    return h;
}
/* backend buffer of `bytes` bytes, every byte `fill` */
static void *dev_filled(size_t bytes, int fill) {
    unsigned char *h = malloc(bytes ? bytes : 1);
    memset(h, fill, bytes);
    void *d = dev_upload(h, bytes);
    free(h);
    return d;
}
static int all_bytes(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

/* Canary bytes after each output, one more row (row_bytes) plus 256: an op must write nothing
 * past its extent (the backend's allocator may round sizes up, so ASan would not see such a
 * write; an off-by-one row lands in the canary instead of the heap). */
static size_t guard_bytes(size_t row_bytes) { return row_bytes + 256; }

/* ================================ to_bf16 ================================ */

/* Inputs whose BF16 rounding is known without bf16_encode: {float bits, BF16 bits}. Checks the
 * reference itself, and the op against it directly. */
static const uint32_t known_bf16[][2] = {
    {0x3F800000u, 0x3F80u}, /* 1.0 exact */
    {0x3F808000u, 0x3F80u}, /* 1 + 2^-8: tie, lower neighbour 0x3F80 even -> down */
    {0x3F818000u, 0x3F82u}, /* tie, lower neighbour 0x3F81 odd -> up */
    {0x3F808001u, 0x3F81u}, /* just above the tie -> up */
    {0x3F807FFFu, 0x3F80u}, /* just below the tie -> down */
    {0xBF808000u, 0xBF80u}, /* negative tie, even lower neighbour */
    {0xBF818000u, 0xBF82u}, /* negative tie, odd lower neighbour */
    {0x3FFF8000u, 0x4000u}, /* tie with odd 0x3FFF: rounds up into the next binade */
    {0x7F7FFFFFu, 0x7F80u}, /* FLT_MAX: beyond the largest BF16 plus half an ulp -> +Inf */
    {0xFF7FFFFFu, 0xFF80u}, /* -FLT_MAX -> -Inf */
    {0x7F7F7FFFu, 0x7F7Fu}, /* just below the tie above the largest finite BF16: stays */
    {0x7F7F8000u, 0x7F80u}, /* tie, odd lower neighbour 0x7F7F -> up, to +Inf */
    {0x7F7E8000u, 0x7F7Eu}, /* tie, even lower neighbour 0x7F7E -> down */
    {0x7F800000u, 0x7F80u}, /* +Inf */
    {0xFF800000u, 0xFF80u}, /* -Inf */
    {0x00000000u, 0x0000u}, /* +0 */
    {0x80000000u, 0x8000u}, /* -0 keeps its sign */
    {0x00000001u, 0x0000u}, /* smallest subnormal -> +0 */
    {0x80000001u, 0x8000u}, /* -> -0 */
    {0x00008000u, 0x0000u}, /* subnormal tie, even lower neighbour 0 -> down */
    {0x00018000u, 0x0002u}, /* subnormal tie, odd lower neighbour 1 -> up */
    {0x00010000u, 0x0001u}, /* smallest BF16 subnormal, exact */
    {0x007FFFFFu, 0x0080u}, /* largest subnormal rounds up to FLT_MIN */
    {0x807F8000u, 0x8080u}, /* negative subnormal tie, odd lower neighbour 0x807F -> up */
    {0x00800000u, 0x0080u}, /* FLT_MIN exact */
};
#define N_KNOWN ((int)(sizeof known_bf16 / sizeof known_bf16[0]))

static void test_bf16_encode_reference(void) {
    for (int i = 0; i < N_KNOWN; i++) {
        uint16_t got = bf16_encode(f32_from_bits(known_bf16[i][0]));
        T_CHECK(got == known_bf16[i][1], "bf16_encode(0x%08X) = 0x%04X, want 0x%04X",
                (unsigned)known_bf16[i][0], (unsigned)got, (unsigned)known_bf16[i][1]);
    }
    /* every NaN (either sign, quiet or signalling) encodes to a NaN */
    const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t got = bf16_encode(f32_from_bits(nans[i]));
        T_CHECK((got & 0x7F80u) == 0x7F80u && (got & 0x7Fu) != 0,
                "bf16_encode(NaN 0x%08X) = 0x%04X is not a NaN", (unsigned)nans[i],
                (unsigned)got);
    }
}

/* The special inputs sprinkled into the to_bf16 tests (NaN goes in separate cases: it decides
 * the amax). */
static const uint32_t specials[] = {
    0x3F808000u, 0x3F818000u, 0xBF808000u, 0xBF818000u, 0x3F808001u, 0x3F807FFFu, 0x3FFF8000u,
    0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F7F7FFFu, 0x7F7F8000u, 0x7F7E8000u, 0x7F800000u, 0xFF800000u,
    0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x00008000u, 0x00018000u, 0x007FFFFFu,
    0x807F8000u, 0x00800000u, 0x42C98000u, 0x42CA8000u,
};
#define N_SPECIALS ((int)(sizeof specials / sizeof specials[0]))

/* One to_bf16 call over x [rows, cols] (host), checked completely:
 *  - out[r * pad(cols) + c] == bf16_encode(x[r * cols + c]) bit for bit,
 *  - the padding (columns cols..pad(cols)-1 of each row, rows rows..pad(rows)-1) is 0 although
 *    the buffer was full of 0xFF, and no byte past fp8t_bf16_bytes changed,
 *  - x is not modified,
 *  - *amax_out (started at amax_start; NULL when !use_amax) equals, bit for bit, what the amax
 *    op gives from the same start. Returns that amax (0 when !use_amax). */
static float check_to_bf16(const char *what, const float *x, int rows, int cols, float amax_start,
                           int use_amax) {
    size_t n = (size_t)rows * cols, bytes = fp8t_bf16_bytes(rows, cols);
    int prow = fp8t_bf16_pad(rows), pcol = fp8t_bf16_pad(cols);
    size_t guard = guard_bytes((size_t)pcol * sizeof(uint16_t));
    float *dx = dev_upload(x, n * sizeof(float));          /* [rows, cols] */
    uint16_t *dout = dev_filled(bytes + guard, 0xFF);      /* [pad(rows), pad(cols)] + guard */
    float *damax = dev_upload(&amax_start, sizeof(float)); /* [1] */
    float *dref = dev_upload(&amax_start, sizeof(float));  /* [1] */

    t_to_bf16(be, dout, use_amax ? damax : NULL, dx, rows, cols);
    OPS->amax(be, dref, dx, n);
    OPS->synchronize(be);

    uint16_t *out = host_download(dout, bytes + guard);
    float *xback = host_download(dx, n * sizeof(float));
    float amax = 0.0f, amax_ref = 0.0f, amax_after = 0.0f;
    OPS->to_host(be, &amax_after, damax, sizeof(float));
    OPS->to_host(be, &amax_ref, dref, sizeof(float));

    int bad = 0;
    for (int r = 0; r < prow && !bad; r++)
        for (int c = 0; c < pcol; c++) {
            uint16_t got = out[(size_t)r * pcol + c];
            uint16_t want = (r < rows && c < cols) ? bf16_encode(x[(size_t)r * cols + c]) : 0;
            if (got != want) {
                T_FAIL("%s: to_bf16 out[%d * %d + %d] = 0x%04X, want 0x%04X (%s; x = 0x%08X)",
                       what, r, pcol, c, (unsigned)got, (unsigned)want,
                       (r < rows && c < cols) ? "element" : "padding",
                       (r < rows && c < cols) ? (unsigned)f32_bits(x[(size_t)r * cols + c]) : 0u);
                bad = 1;
                break;
            }
        }
    T_CHECK(all_bytes((const unsigned char *)out + bytes, guard, 0xFF),
            "%s: to_bf16 wrote past fp8t_bf16_bytes(%d, %d) = %zu", what, rows, cols, bytes);
    T_CHECK(memcmp(xback, x, n * sizeof(float)) == 0, "%s: to_bf16 modified its input", what);
    if (use_amax) {
        amax = amax_after;
        T_CHECK(f32_bits(amax) == f32_bits(amax_ref),
                "%s: to_bf16 amax %.9g (0x%08X) differs from the amax op's %.9g (0x%08X) from "
                "start %.9g",
                what, amax, (unsigned)f32_bits(amax), amax_ref, (unsigned)f32_bits(amax_ref),
                amax_start);
    }
    free(out);
    free(xback);
    OPS->free(be, dx);
    OPS->free(be, dout);
    OPS->free(be, damax);
    OPS->free(be, dref);
    return amax;
}

static float host_amax(const float *x, size_t n) { /* finite or Inf inputs only */
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

static const int shapes[][2] = {
    {1, 1},    {3, 5}, {7, 13}, {8, 8},    {37, 1001},
    {64, 768}, {1, 9}, {9, 1},  {300, 257} /* > the OpenMP threshold */};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static void test_to_bf16_random(void) {
    for (int s = 0; s < N_SHAPES; s++) {
        int rows = shapes[s][0], cols = shapes[s][1];
        size_t n = (size_t)rows * cols;
        float *x = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) x[i] = rand_value();
        float m = host_amax(x, n);
        char what[96];
        snprintf(what, sizeof what, "random %dx%d", rows, cols);
        /* a smaller start value is replaced by amax(x) */
        float got = check_to_bf16(what, x, rows, cols, 0.0f, 1);
        T_CHECK(got == m, "%s: amax %.9g from start 0, want %.9g", what, got, m);
        /* a larger start value stays */
        got = check_to_bf16(what, x, rows, cols, 2.0f * m + 1.0f, 1);
        T_CHECK(got == 2.0f * m + 1.0f, "%s: amax %.9g, the larger start %.9g must stay", what,
                got, 2.0f * m + 1.0f);
        /* a start between elements: replaced */
        got = check_to_bf16(what, x, rows, cols, m * 0.75f, 1);
        T_CHECK(got == m, "%s: amax %.9g from start %.9g, want %.9g", what, got, m * 0.75f, m);
        /* no amax wanted */
        check_to_bf16(what, x, rows, cols, 0.5f, 0);
        free(x);
    }
}

/* The specials, each at least once in every shape: in the small shapes spread over as many
 * calls as needed, in the large ones at spread-out positions among random values. */
static void test_to_bf16_specials(void) {
    for (int s = 0; s < N_SHAPES; s++) {
        int rows = shapes[s][0], cols = shapes[s][1];
        size_t n = (size_t)rows * cols;
        float *x = malloc(n * sizeof(float));
        for (size_t done = 0; done < (size_t)N_SPECIALS;) {
            for (size_t i = 0; i < n; i++) x[i] = rand_value();
            size_t take = n < (size_t)N_SPECIALS - done ? n : (size_t)N_SPECIALS - done;
            size_t stride = n / take; /* >= 1 */
            int has_inf = 0;
            for (size_t k = 0; k < take; k++) {
                uint32_t u = specials[done + k];
                x[k * stride + (stride > 1 ? (size_t)rng_int((int)stride) : 0)] =
                    f32_from_bits(u);
            }
            for (size_t i = 0; i < n; i++) has_inf |= isinf(x[i]) != 0;
            done += take;
            char what[96];
            snprintf(what, sizeof what, "specials %dx%d (through #%zu)", rows, cols, done);
            float got = check_to_bf16(what, x, rows, cols, 0.125f, 1);
            float want = fmaxf(0.125f, host_amax(x, n));
            T_CHECK(got == want && (!has_inf || isinf(got)), "%s: amax %.9g, want %.9g", what,
                    got, want);
        }
        /* and the known roundings directly (the op against the table, not only bf16_encode) */
        if (s == 2) { /* 7x13 = 91 >= N_KNOWN */
            for (size_t i = 0; i < n; i++) x[i] = rand_value();
            for (int k = 0; k < N_KNOWN; k++) x[k] = f32_from_bits(known_bf16[k][0]);
            float *dx = dev_upload(x, n * sizeof(float));
            uint16_t *dout = dev_filled(fp8t_bf16_bytes(rows, cols), 0xFF);
            t_to_bf16(be, dout, NULL, dx, rows, cols);
            uint16_t *out = host_download(dout, fp8t_bf16_bytes(rows, cols));
            for (int k = 0; k < N_KNOWN; k++) {
                uint16_t got = out[(size_t)(k / cols) * fp8t_bf16_pad(cols) + k % cols];
                T_CHECK(got == known_bf16[k][1], "to_bf16(0x%08X) = 0x%04X, want 0x%04X",
                        (unsigned)known_bf16[k][0], (unsigned)got, (unsigned)known_bf16[k][1]);
            }
            free(out);
            OPS->free(be, dx);
            OPS->free(be, dout);
        }
        free(x);
    }
}

/* A NaN anywhere (first, middle, last element; either sign; signalling) makes the amax NaN,
 * whatever the start value; a NaN start stays NaN; the NaN element itself encodes as
 * bf16_encode says (checked by check_to_bf16). */
static void test_to_bf16_nan(void) {
    const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u};
    for (int s = 0; s < N_SHAPES; s++) {
        int rows = shapes[s][0], cols = shapes[s][1];
        size_t n = (size_t)rows * cols;
        float *x = malloc(n * sizeof(float));
        size_t where[3] = {0, n / 2, n - 1};
        for (int w = 0; w < 3; w++) {
            for (size_t i = 0; i < n; i++) x[i] = rand_value();
            x[where[w]] = f32_from_bits(nans[w]);
            char what[96];
            snprintf(what, sizeof what, "NaN at %zu of %dx%d", where[w], rows, cols);
            float got = check_to_bf16(what, x, rows, cols, 0.0f, 1);
            T_CHECK(isnan(got), "%s: amax %.9g from start 0, want NaN", what, got);
            got = check_to_bf16(what, x, rows, cols, 1e30f, 1);
            T_CHECK(isnan(got), "%s: amax %.9g from start 1e30, want NaN", what, got);
            check_to_bf16(what, x, rows, cols, 0.0f, 0);
        }
        for (size_t i = 0; i < n; i++) x[i] = rand_value();
        char what[96];
        snprintf(what, sizeof what, "NaN start, %dx%d", rows, cols);
        float got = check_to_bf16(what, x, rows, cols, NAN, 1);
        T_CHECK(isnan(got), "%s: amax %.9g, a NaN start must stay NaN", what, got);
        free(x);
    }
}

/* rows or cols 0: nothing to write (fp8t_bf16_bytes is 0), the amax unchanged */
static void test_to_bf16_empty(void) {
    const int empty[][2] = {{0, 0}, {0, 5}, {5, 0}, {0, 8}};
    float x[1] = {7.0f};
    for (size_t e = 0; e < sizeof empty / sizeof empty[0]; e++) {
        int rows = empty[e][0], cols = empty[e][1];
        T_CHECK(fp8t_bf16_bytes(rows, cols) == 0, "fp8t_bf16_bytes(%d, %d) = %zu", rows, cols,
                fp8t_bf16_bytes(rows, cols));
        char what[64];
        snprintf(what, sizeof what, "empty %dx%d", rows, cols);
        float got = check_to_bf16(what, x, rows, cols, 0.25f, 1);
        T_CHECK(got == 0.25f, "%s: amax %.9g, want the start 0.25", what, got);
    }
}

/* ============================ gemm_bf16_rounded ============================ */

/* A BF16 operand made by to_bf16 from the backend tensor x [rows, cols] */
typedef struct {
    fp8t_bf16_operand op;
    uint16_t *buf; /* [pad(rows), pad(cols)] */
} bf16_tensor;

static bf16_tensor make_operand(const float *dx, int rows, int cols) {
    bf16_tensor t;
    t.buf = OPS->malloc(be, fp8t_bf16_bytes(rows, cols));
    t_to_bf16(be, t.buf, NULL, dx, rows, cols);
    t.op.data = t.buf;
    t.op.rows = rows;
    t.op.cols = cols;
    return t;
}

/* One GEMM shape and combination: gemm_bf16 on the FP32 tensors vs gemm_bf16_rounded on their
 * to_bf16 operands, bit for bit, C pre-filled (random with acc, NaN without: an overwrite must
 * not read C), nothing written past C or into the operands; with bias (acc = 0), against
 * gemm_bf16 then bias_add. */
static void check_gemm_rounded(int M, int N, int K, int ta, int tb, int acc, int with_bias) {
    char what[128];
    snprintf(what, sizeof what, "%dx%dx%d transA=%d transB=%d acc=%d bias=%d", M, N, K, ta, tb,
             acc, with_bias);
    /* stored layouts: A [K,M] when transA else [M,K]; B [N,K] when transB else [K,N] */
    int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    size_t nguard = guard_bytes((size_t)(N > 0 ? N : 0) * sizeof(float)) / sizeof(float);
    float *A = malloc((na ? na : 1) * sizeof(float)), *B = malloc((nb ? nb : 1) * sizeof(float));
    float *C0 = malloc((nc + nguard) * sizeof(float)); /* [M, N] + guard */
    float *bias = malloc((N > 0 ? (size_t)N : 1) * sizeof(float));
    for (size_t i = 0; i < na; i++) A[i] = rand_value();
    for (size_t i = 0; i < nb; i++) B[i] = rand_value();
    for (size_t i = 0; i < nc + nguard; i++)
        C0[i] = acc ? (float)(rng_uniform() * 8.0 - 4.0) : NAN;
    for (int j = 0; j < N; j++) bias[j] = (float)(rng_uniform() * 2.0 - 1.0);
    size_t cbytes = (nc + nguard) * sizeof(float); /* C + guard */

    float *dA = dev_upload(A, na * sizeof(float)); /* stored [ar, ac] */
    float *dB = dev_upload(B, nb * sizeof(float)); /* stored [br, bc] */
    float *dbias = dev_upload(bias, (size_t)(N > 0 ? N : 0) * sizeof(float)); /* [N] */
    float *dCw = dev_upload(C0, cbytes); /* [M, N] + guard: gemm_bf16 */
    float *dCg = dev_upload(C0, cbytes); /* [M, N] + guard: gemm_bf16_rounded */
    bf16_tensor a16 = make_operand(dA, ar, ac), b16 = make_operand(dB, br, bc);
    size_t abytes = fp8t_bf16_bytes(ar, ac), bbytes = fp8t_bf16_bytes(br, bc);
    uint16_t *a_before = host_download(a16.buf, abytes),
             *b_before = host_download(b16.buf, bbytes);

    OPS->gemm_bf16(be, dCw, dA, dB, M, N, K, ta, tb, acc, NULL, NULL);
    if (with_bias) OPS->bias_add(be, dCw, dbias, M, N);
    OPS->gemm_bf16_rounded(be, dCg, &a16.op, &b16.op, M, N, K, ta, tb, acc,
                           with_bias ? dbias : NULL, 0);
    OPS->synchronize(be);

    float *Cw = host_download(dCw, cbytes), *Cg = host_download(dCg, cbytes);
    uint16_t *a_after = host_download(a16.buf, abytes), *b_after = host_download(b16.buf, bbytes);
    for (size_t i = 0; i < nc; i++)
        if (f32_bits(Cg[i]) != f32_bits(Cw[i])) {
            T_FAIL("%s: C[%zu] (row %zu col %zu) = %.9g (0x%08X), gemm_bf16%s gives %.9g "
                   "(0x%08X)",
                   what, i, i / (size_t)N, i % (size_t)N, Cg[i], (unsigned)f32_bits(Cg[i]),
                   with_bias ? " + bias_add" : "", Cw[i], (unsigned)f32_bits(Cw[i]));
            break;
        }
    T_CHECK(memcmp(Cg + nc, C0 + nc, nguard * sizeof(float)) == 0, "%s: wrote past C[M, N]",
            what);
    T_CHECK(memcmp(a_after, a_before, abytes) == 0 && memcmp(b_after, b_before, bbytes) == 0,
            "%s: modified an operand", what);
    /* the sizes gemm_bf16 treats specially, checked directly too */
    if (M == 0 || N == 0)
        T_CHECK(memcmp(Cg, C0, cbytes) == 0, "%s: an empty C must leave the buffer alone", what);
    else if (K == 0)
        for (size_t i = 0; i < nc; i++) {
            float want = acc ? C0[i] : with_bias ? bias[i % (size_t)N] : 0.0f;
            if (f32_bits(Cg[i]) != f32_bits(want)) {
                T_FAIL("%s: K = 0: C[%zu] = %.9g, want %.9g", what, i, Cg[i], want);
                break;
            }
        }

    free(A);
    free(B);
    free(C0);
    free(bias);
    free(Cw);
    free(Cg);
    free(a_before);
    free(b_before);
    free(a_after);
    free(b_after);
    OPS->free(be, dA);
    OPS->free(be, dB);
    OPS->free(be, dbias);
    OPS->free(be, dCw);
    OPS->free(be, dCg);
    OPS->free(be, a16.buf);
    OPS->free(be, b16.buf);
}

static const int gemm_shapes[][3] = {{5, 7, 3},   {37, 1001, 13}, {64, 96, 128}, {1, 1, 1},
                                     {8, 8, 8},   {13, 17, 19},   {1, 33, 70},   {40, 1, 9},
                                     {16, 24, 1}, {9, 15, 17}};

static void test_gemm_bf16_rounded(void) {
    for (size_t s = 0; s < sizeof gemm_shapes / sizeof gemm_shapes[0]; s++)
        for (int combo = 0; combo < 8; combo++)
            check_gemm_rounded(gemm_shapes[s][0], gemm_shapes[s][1], gemm_shapes[s][2], combo & 1,
                               (combo >> 1) & 1, (combo >> 2) & 1, 0);
}

static void test_gemm_bf16_rounded_bias(void) {
    for (size_t s = 0; s < sizeof gemm_shapes / sizeof gemm_shapes[0]; s++)
        for (int combo = 0; combo < 4; combo++)
            check_gemm_rounded(gemm_shapes[s][0], gemm_shapes[s][1], gemm_shapes[s][2], combo & 1,
                               (combo >> 1) & 1, 0, 1);
}

/* gemm_tn_bf16_out: Y = X·Wᵀ written as BF16 values, every element bf16_encode of the FP32
 * result gemm_bf16_rounded (BF16 operands) or gemm_fp8 (per-tensor E4M3 operands) gives for the
 * same operands, nothing written past C16 [M, N] */
static void test_gemm_tn_bf16_out(void) {
    for (size_t s = 0; s < sizeof gemm_shapes / sizeof gemm_shapes[0]; s++) {
        const int M = gemm_shapes[s][0], N = gemm_shapes[s][1], K = gemm_shapes[s][2];
        const size_t na = (size_t)M * K, nb = (size_t)N * K, nc = (size_t)M * N, guard = 64;
        float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc(nc * 4);
        for (size_t i = 0; i < na; i++) A[i] = (float)(rng_uniform() * 4.0 - 2.0);
        for (size_t i = 0; i < nb; i++) B[i] = (float)(rng_uniform() * 4.0 - 2.0);
        float *dA = dev_upload(A, na * 4), *dB = dev_upload(B, nb * 4);
        float *dC = OPS->malloc(be, nc * 4);
        const float sc[2] = {64.0f, 1.0f / 64.0f}; /* scale, scale_inv of both FP8 operands */
        float *dsc = dev_upload(sc, sizeof sc);
        uint8_t *ca = OPS->malloc(be, na), *cb = OPS->malloc(be, nb);
        t_quantize(be, ca, NULL, NULL, dA, M, K, FP8_E4M3, dsc);
        t_quantize(be, cb, NULL, NULL, dB, N, K, FP8_E4M3, dsc);
        const fp8t_fp8_operand a8 = {ca, NULL, dsc + 1, FP8_E4M3, M, K, FP8T_SCALING_TENSOR};
        const fp8t_fp8_operand b8 = {cb, NULL, dsc + 1, FP8_E4M3, N, K, FP8T_SCALING_TENSOR};
        bf16_tensor a16 = make_operand(dA, M, K), b16 = make_operand(dB, N, K);
        for (int fp8 = 0; fp8 < 2; fp8++) {
            uint16_t *d16 = OPS->malloc(be, (nc + guard) * 2);
            uint16_t *c16 = malloc((nc + guard) * 2), *fill16 = malloc((nc + guard) * 2);
            memset(fill16, 0x5A, (nc + guard) * 2);
            OPS->to_device(be, d16, fill16, (nc + guard) * 2);
            if (fp8) {
                OPS->gemm_fp8(be, dC, &a8, &b8, M, N, K, 0, 1, 0, 1, NULL, NULL);
                OPS->gemm_tn_bf16_out(be, d16, &a8, &b8, NULL, NULL, M, N, K, 1);
            } else {
                OPS->gemm_bf16_rounded(be, dC, &a16.op, &b16.op, M, N, K, 0, 1, 0, NULL, 0);
                OPS->gemm_tn_bf16_out(be, d16, NULL, NULL, &a16.op, &b16.op, M, N, K, 0);
            }
            OPS->to_host(be, C, dC, nc * 4);
            OPS->to_host(be, c16, d16, (nc + guard) * 2);
            size_t bad = 0;
            for (size_t i = 0; i < nc; i++) bad += c16[i] != bf16_encode(C[i]);
            T_CHECK(bad == 0, "%dx%dx%d %s: %zu of %zu values are not the FP32 result's rounding",
                    M, N, K, fp8 ? "fp8" : "bf16", bad, nc);
            T_CHECK(!memcmp(c16 + nc, fill16 + nc, guard * 2), "%dx%dx%d %s: wrote past C16", M,
                    N, K, fp8 ? "fp8" : "bf16");
            OPS->free(be, d16);
            free(c16), free(fill16);
        }
        OPS->free(be, dA), OPS->free(be, dB), OPS->free(be, dC), OPS->free(be, dsc);
        OPS->free(be, ca), OPS->free(be, cb), OPS->free(be, a16.buf), OPS->free(be, b16.buf);
        free(A), free(B), free(C);
    }
}

/* K = 0 (empty sum: C zeroed, or left alone with acc; bias alone with a bias), M = 0, N = 0
 * (nothing written), in every layout */
static void test_gemm_bf16_rounded_degenerate(void) {
    const int deg[][3] = {{5, 7, 0}, {9, 1, 0}, {0, 7, 3}, {0, 7, 0},
                          {5, 0, 3}, {5, 0, 0}, {0, 0, 4}};
    for (size_t s = 0; s < sizeof deg / sizeof deg[0]; s++)
        for (int combo = 0; combo < 12; combo++) {
            int acc = (combo >> 2) == 1, bias = (combo >> 2) == 2;
            check_gemm_rounded(deg[s][0], deg[s][1], deg[s][2], combo & 1, (combo >> 1) & 1, acc,
                               bias);
        }
}

/* gemm_bf16_rounded into C [M, ldc]: the first N columns of each row bit for bit the packed
 * result (the same call with ldc = 0), columns [pad8(N), ldc) untouched, [N, pad8(N)) zero or
 * untouched (with acc: untouched or + 0), for every layout, with and without bias. */
static void check_gemm_rounded_ld(int M, int N, int K, int ldc, int ta, int tb, int acc,
                                  int with_bias) {
    char what[128];
    snprintf(what, sizeof what, "%dx%dx%d ldc=%d transA=%d transB=%d acc=%d bias=%d", M, N, K,
             ldc, ta, tb, acc, with_bias);
    int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N, ns = (size_t)M * ldc;
    float *A = malloc(na * sizeof(float)), *B = malloc(nb * sizeof(float));
    float *Cp0 = malloc(nc * sizeof(float)), *Cs0 = malloc(ns * sizeof(float));
    float *bias = malloc((size_t)N * sizeof(float));
    for (size_t i = 0; i < na; i++) A[i] = rand_value();
    for (size_t i = 0; i < nb; i++) B[i] = rand_value();
    for (int j = 0; j < N; j++) bias[j] = (float)(rng_uniform() * 2.0 - 1.0);
    for (size_t i = 0; i < ns; i++) Cs0[i] = (float)(rng_uniform() * 8.0 - 4.0);
    for (int r = 0; r < M; r++) memcpy(Cp0 + (size_t)r * N, Cs0 + (size_t)r * ldc, (size_t)N * 4);
    float *dA = dev_upload(A, na * 4), *dB = dev_upload(B, nb * 4),
          *dbias = dev_upload(bias, (size_t)N * 4);
    float *dCp = dev_upload(Cp0, nc * 4), *dCs = dev_upload(Cs0, ns * 4);
    bf16_tensor a16 = make_operand(dA, ar, ac), b16 = make_operand(dB, br, bc);
    const float *bp = with_bias ? dbias : NULL;
    OPS->gemm_bf16_rounded(be, dCp, &a16.op, &b16.op, M, N, K, ta, tb, acc, bp, 0);
    OPS->gemm_bf16_rounded(be, dCs, &a16.op, &b16.op, M, N, K, ta, tb, acc, bp, ldc);
    OPS->synchronize(be);
    float *Cp = host_download(dCp, nc * 4), *Cs = host_download(dCs, ns * 4);
    int bad = 0;
    const int Np = fp8t_bf16_pad(N);
    for (int r = 0; r < M && !bad; r++)
        for (int c = 0; c < ldc && !bad; c++) {
            float got = Cs[(size_t)r * ldc + c], was = Cs0[(size_t)r * ldc + c];
            if (c < N && f32_bits(got) != f32_bits(Cp[(size_t)r * N + c])) {
                T_FAIL("%s: C[%d, %d] = %.9g, the packed call gives %.9g", what, r, c, got,
                       Cp[(size_t)r * N + c]);
                bad = 1;
            } else if (c >= Np && f32_bits(got) != f32_bits(was)) {
                T_FAIL("%s: C[%d, %d] past pad8(N) was written", what, r, c);
                bad = 1;
            } else if (c >= N && c < Np && f32_bits(got) != f32_bits(was) &&
                       !(got == 0.0f && !acc) && !(acc && got == was + 0.0f)) {
                T_FAIL("%s: C[%d, %d] in the padding = %.9g (was %.9g)", what, r, c, got, was);
                bad = 1;
            }
        }
    T_CHECK(!bad, "%s: strided result", what);
    free(A), free(B), free(Cp0), free(Cs0), free(bias), free(Cp), free(Cs);
    OPS->free(be, dA), OPS->free(be, dB), OPS->free(be, dbias), OPS->free(be, dCp);
    OPS->free(be, dCs), OPS->free(be, a16.buf), OPS->free(be, b16.buf);
}

static void test_gemm_bf16_rounded_ldc(void) {
    const int shapes[][4] = {
        {5, 7, 3, 8}, {37, 1001, 13, 1008}, {9, 16, 17, 24}, {1, 1, 1, 11}, {13, 17, 19, 17}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int combo = 0; combo < 12; combo++) {
            int acc = (combo >> 2) == 1, bias = (combo >> 2) == 2;
            check_gemm_rounded_ld(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3],
                                  combo & 1, (combo >> 1) & 1, acc, bias);
        }
}

/* ================================ softmax_xent_bf16 ================================ */

/* softmax_xent_bf16 on logits [N, ld] vs softmax_xent on the packed [N, V] copy then to_bf16:
 * losses, the whole padded operand and the amax, bit for bit. */
static void check_xent_bf16(int N, int V, int ld, float dloss, int nan_row) {
    char what[96];
    snprintf(what, sizeof what, "N=%d V=%d ld=%d dloss=%g nan_row=%d", N, V, ld, dloss, nan_row);
    float *lg = malloc((size_t)N * ld * 4), *packed = malloc((size_t)N * V * 4);
    int *tg = malloc((size_t)N * sizeof(int));
    for (int r = 0; r < N; r++) {
        for (int c = 0; c < ld; c++)
            lg[(size_t)r * ld + c] = c < V ? (float)(rng_uniform() * 20.0 - 10.0) : NAN;
        tg[r] = r % 5 == 3 ? -1 : rng_int(V); /* some positions ignored */
    }
    if (nan_row >= 0) lg[(size_t)nan_row * ld + V / 2] = NAN;
    for (int r = 0; r < N; r++)
        memcpy(packed + (size_t)r * V, lg + (size_t)r * ld, (size_t)V * 4);
    size_t hb = fp8t_bf16_bytes(N, V);
    float *dlg = dev_upload(lg, (size_t)N * ld * 4), *dpk = dev_upload(packed, (size_t)N * V * 4);
    int *dtg = dev_upload(tg, (size_t)N * sizeof(int));
    float *dl1 = dev_filled((size_t)N * 4, 0x7F), *dl2 = dev_filled((size_t)N * 4, 0x7F);
    uint16_t *h1 = dev_filled(hb, 0xFF), *h2 = dev_filled(hb, 0xFF);
    float am0 = 0.25f;
    float *dam1 = dev_upload(&am0, 4), *dam2 = dev_upload(&am0, 4);
    OPS->softmax_xent_bf16(be, dl1, h1, dam1, NULL, dlg, ld, dtg, N, V, dloss);
    /* the FP32 gradient as well, in place over a copy of the strided logits */
    float *dlg3 = dev_upload(lg, (size_t)N * ld * 4), *dl3 = dev_filled((size_t)N * 4, 0x7F);
    uint16_t *h3 = dev_filled(hb, 0xFF);
    float *dam3 = dev_upload(&am0, 4);
    OPS->softmax_xent_bf16(be, dl3, h3, dam3, dlg3, dlg3, ld, dtg, N, V, dloss);
    OPS->softmax_xent(be, dl2, dpk, dpk, dtg, N, V, dloss);
    t_to_bf16(be, h2, dam2, dpk, N, V);
    OPS->synchronize(be);
    {
        float *l3 = host_download(dl3, (size_t)N * 4),
              *g3 = host_download(dlg3, (size_t)N * ld * 4);
        float *g2 = host_download(dpk, (size_t)N * V * 4);
        uint16_t *o3 = host_download(h3, hb), *o1 = host_download(h1, hb);
        float *l1 = host_download(dl1, (size_t)N * 4);
        size_t rows_bad = 0, pad_bad = 0;
        for (int r = 0; r < N; r++) {
            rows_bad += memcmp(g3 + (size_t)r * ld, g2 + (size_t)r * V, (size_t)V * 4) != 0;
            for (int c = V; c < ld; c++)
                pad_bad += f32_bits(g3[(size_t)r * ld + c]) != f32_bits(lg[(size_t)r * ld + c]);
        }
        T_CHECK(rows_bad == 0, "%s: %zu rows of the FP32 gradient differ from softmax_xent's",
                what, rows_bad);
        T_CHECK(pad_bad == 0, "%s: %zu columns past V were written", what, pad_bad);
        T_CHECK(memcmp(o3, o1, hb) == 0 && memcmp(l3, l1, (size_t)N * 4) == 0,
                "%s: asking for the FP32 gradient changed the BF16 operand or the losses", what);
        free(l3), free(g3), free(g2), free(o3), free(o1), free(l1);
    }
    OPS->free(be, dlg3), OPS->free(be, dl3), OPS->free(be, h3), OPS->free(be, dam3);
    float *l1 = host_download(dl1, (size_t)N * 4), *l2 = host_download(dl2, (size_t)N * 4);
    uint16_t *o1 = host_download(h1, hb), *o2 = host_download(h2, hb);
    float am1, am2;
    OPS->to_host(be, &am1, dam1, 4);
    OPS->to_host(be, &am2, dam2, 4);
    T_CHECK(memcmp(l1, l2, (size_t)N * 4) == 0, "%s: losses differ from softmax_xent's", what);
    T_CHECK(memcmp(o1, o2, hb) == 0, "%s: the operand differs from softmax_xent + to_bf16", what);
    T_CHECK(f32_bits(am1) == f32_bits(am2), "%s: amax %g, to_bf16 gives %g", what, am1, am2);
    if (nan_row >= 0) T_CHECK(isnan(am1), "%s: a NaN logit must make the amax NaN", what);
    free(lg), free(packed), free(tg), free(l1), free(l2), free(o1), free(o2);
    OPS->free(be, dlg), OPS->free(be, dpk), OPS->free(be, dtg), OPS->free(be, dl1);
    OPS->free(be, dl2), OPS->free(be, h1), OPS->free(be, h2), OPS->free(be, dam1);
    OPS->free(be, dam2);
}

static void test_softmax_xent_bf16(void) {
    check_xent_bf16(7, 13, 16, 0.125f, -1);
    check_xent_bf16(16, 257, 264, 1.0f / 3.0f, -1);
    check_xent_bf16(3, 8, 8, 2.0f, -1);
    check_xent_bf16(9, 101, 104, 0.5f, 4);
    check_xent_bf16(1, 1, 8, 1.0f, -1);
}

int main(void) {
    t_suite = "bf16_operand";
    char err[256] = "";
    be = fp8t_backend_create("cpu", NULL, err, sizeof err);
    if (!be) {
        printf("FAIL bf16_operand: backend create: %s\n", err);
        return 1;
    }
    if (!OPS->make_operand || !OPS->gemm_bf16_rounded) {
        printf("FAIL bf16_operand: the CPU backend lacks make_operand / gemm_bf16_rounded\n");
        fp8t_backend_destroy(be);
        return 1;
    }
    T_RUN(test_bf16_encode_reference);
    T_RUN(test_to_bf16_random);
    T_RUN(test_to_bf16_specials);
    T_RUN(test_to_bf16_nan);
    T_RUN(test_to_bf16_empty);
    T_RUN(test_gemm_bf16_rounded);
    T_RUN(test_gemm_bf16_rounded_bias);
    T_RUN(test_gemm_bf16_rounded_degenerate);
    T_RUN(test_gemm_bf16_rounded_ldc);
    T_RUN(test_gemm_tn_bf16_out);
    T_RUN(test_softmax_xent_bf16);
    fp8t_backend_destroy(be);
    T_MAIN_END();
}
