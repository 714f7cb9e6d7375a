/* Tests of the CPU backend op table (src/backend/cpu): every forward op against a naive
 * reference written here in double, every backward op against central finite differences of
 * that double reference (scalar loss = a random projection of the output), the GEMMs in every
 * transpose/acc combination, the quantization ops against the numerics library, and
 * determinism (same call twice, and 1 vs 2 vs 3 OpenMP threads, bit for bit). */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h" /* cpu_expf, cpu_row_max */
#include "fp8train/backend.h"
#include "fp8train/fp8.h"
#include "fp8train/recipe.h"
#include "operand_ops.h"
#include "test.h"
#include "test_rng.h"

static fp8t_backend *be;
#define OPS (be->ops)

/* ---- helpers ---- */

static float rng_float(float lo, float hi) { return lo + (hi - lo) * (float)rng_uniform(); }

/* backend ("device") buffer filled with uniform values in [lo, hi) */
static float *dev_rand(size_t n, float lo, float hi) {
    float *p = OPS->malloc(be, n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = rng_float(lo, hi);
    return p;
}
static float *dev_floats(size_t n) { return OPS->malloc(be, n * sizeof(float)); }
static float *dev_copy(const float *src, size_t n) {
    float *p = dev_floats(n);
    memcpy(p, src, n * sizeof(float));
    return p;
}
static double *to_double(const float *x, size_t n) {
    double *d = malloc((n ? n : 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}
static int bits_equal(const void *a, const void *b, size_t bytes) {
    return memcmp(a, b, bytes) == 0;
}

/* ---- finite differences of a double reference ----
 * A reference computes out[n_out] from its double inputs; the loss is sum(r * out). */
typedef void (*ref_fn)(double *out, double **in, const void *ctx);

static double proj_loss(ref_fn f, const void *ctx, double **in, size_t n_out, const double *r) {
    double *out = calloc(n_out, sizeof(double));
    f(out, in, ctx);
    double L = 0.0;
    for (size_t i = 0; i < n_out; i++) L += r[i] * out[i];
    free(out);
    return L;
}

/* g[k] = dL/d in[which][k] by central differences with step h */
static void fd_grad(double *g, ref_fn f, const void *ctx, double **in, int which, size_t n,
                    size_t n_out, const double *r) {
    const double h = 1e-6;
    for (size_t k = 0; k < n; k++) {
        double save = in[which][k];
        in[which][k] = save + h;
        double lp = proj_loss(f, ctx, in, n_out, r);
        in[which][k] = save - h;
        double lm = proj_loss(f, ctx, in, n_out, r);
        in[which][k] = save;
        g[k] = (lp - lm) / (2 * h);
    }
}

/* Checks got[i] - base[i] (base NULL: 0) against want[i] (the FD gradient) with a tolerance
 * relative to the gradient's scale: float analytic vs double finite differences. */
static void check_grad(const char *what, const float *got, const float *base, const double *want,
                       size_t n, double rtol) {
    double scale = 0.0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    double worst = 0.0;
    size_t worst_i = 0;
    for (size_t i = 0; i < n; i++) {
        double g = (double)got[i] - (base ? (double)base[i] : 0.0);
        double err = fabs(g - want[i]) / (scale * rtol + 1e-9 + rtol * fabs(want[i]));
        if (!(err <= worst)) {
            worst = err;
            worst_i = i;
        }
    }
    if (!(worst <= 1.0)) {
        double g = (double)got[worst_i] - (base ? (double)base[worst_i] : 0.0);
        T_FAIL("%s: element %zu: analytic %.9g vs finite differences %.9g (grad scale %.3g, "
               "rtol %g)",
               what, worst_i, g, want[worst_i], scale, rtol);
    }
}

/* max |got - want| <= atol + rtol * |want| over all elements */
static void check_close(const char *what, const float *got, const double *want, size_t n,
                        double atol, double rtol) {
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= atol + rtol * fabs(want[i]))) {
            T_FAIL("%s: element %zu: got %.9g want %.9g (atol %g rtol %g)", what, i,
                   (double)got[i], want[i], atol, rtol);
            return;
        }
}

/* ================================ internals ================================ */

/* The backend's vectorizable exp: within 2 ulp of exp() in double on a sample of every
 * binade from -104 to 89 (incl. the subnormal results), exact specials. */
static void test_cpu_expf(void) {
    double worst = 0.0;
    float worst_x = 0.0f;
    for (uint32_t u = 0; u < 0xFFFFFFFFu - 4093; u += 4093) {
        float x;
        memcpy(&x, &u, sizeof x);
        if (!(x >= -104.0f && x <= 88.7f)) continue;
        double want = exp((double)x), got = cpu_expf(x);
        int e;
        frexp(want, &e);
        double ulp = want < FLT_MIN ? ldexp(1.0, -149) : ldexp(1.0, e - 24);
        double err = fabs(got - want) / ulp;
        if (err > worst) {
            worst = err;
            worst_x = x;
        }
    }
    T_CHECK(worst <= 2.0, "cpu_expf: %.3f ulp at x = %.9g", worst, worst_x);
    T_CHECK(cpu_expf(0.0f) == 1.0f && cpu_expf(-0.0f) == 1.0f, "exp(0)");
    T_CHECK(isinf(cpu_expf(89.0f)) && isinf(cpu_expf(1e30f)) && isinf(cpu_expf(INFINITY)),
            "overflow must give Inf");
    T_CHECK(cpu_expf(-110.0f) == 0.0f && cpu_expf(-INFINITY) == 0.0f, "underflow must give 0");
    T_CHECK(isnan(cpu_expf(NAN)) && isnan(cpu_expf(-NAN)), "NaN must stay NaN");
    float row[11] = {3, -1, 7.5f, 2, NAN, 7.25f, -100, 0, 1, 7.4f, 6};
    T_CHECK(cpu_row_max(row, 11) == 7.5f && cpu_row_max(row, 2) == 3.0f &&
                cpu_row_max(row, 0) == -INFINITY,
            "cpu_row_max");
}

/* ================================ memory ================================ */

static void test_memory(void) {
    size_t sizes[] = {0, 1, 3, 64, 1000, 1 << 20};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        unsigned char *p = OPS->malloc(be, sizes[s]);
        T_ASSERT(p != NULL, "malloc(%zu) returned NULL", sizes[s]);
        T_CHECK(((uintptr_t)p % 64) == 0, "malloc(%zu) not 64-byte aligned", sizes[s]);
        int nonzero = 0;
        for (size_t i = 0; i < sizes[s]; i++) nonzero |= p[i];
        T_CHECK(!nonzero, "malloc(%zu) not zeroed", sizes[s]);
        OPS->free(be, p);
    }
    float host[100], back[100];
    for (int i = 0; i < 100; i++) host[i] = (float)i * 0.5f - 7.0f;
    float *d = dev_floats(100), *d2 = dev_floats(100);
    OPS->to_device(be, d, host, sizeof host);
    OPS->copy(be, d2, d, sizeof host);
    OPS->synchronize(be);
    OPS->to_host(be, back, d2, sizeof back);
    T_CHECK(bits_equal(back, host, sizeof host), "to_device/copy/to_host round trip differs");
    OPS->zero(be, d2 + 10, 20 * sizeof(float));
    OPS->to_host(be, back, d2, sizeof back);
    for (int i = 0; i < 100; i++) {
        float want = (i >= 10 && i < 30) ? 0.0f : host[i];
        T_CHECK(back[i] == want, "zero: element %d is %g, want %g", i, back[i], want);
    }
    T_CHECK(strcmp(be->name, "cpu") == 0, "name %s", be->name);
    T_CHECK(be->fp8_wants_transpose == 0, "fp8_wants_transpose %d", be->fp8_wants_transpose);
    OPS->free(be, d);
    OPS->free(be, d2);
}

/* ================================ GEMMs ================================ */

/* op(X)[i][j] where op(X) is rows x cols: X is stored [cols, rows] when trans, else
 * [rows, cols] */
static double at(const float *X, int trans, int i, int j, int rows, int cols) {
    return trans ? X[(size_t)j * rows + i] : X[(size_t)i * cols + j];
}

/* ref[M,N] = op(A)·op(B) in double; absref = sum |a||b| (for the rounding bound) */
static void gemm_ref(double *ref, double *absref, const float *A, const float *B, int M, int N,
                     int K, int transA, int transB) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0, sa = 0.0;
            for (int k = 0; k < K; k++) {
                double a = at(A, transA, i, k, M, K), bb = at(B, transB, k, j, K, N);
                s += a * bb;
                sa += fabs(a * bb);
            }
            ref[(size_t)i * N + j] = s;
            absref[(size_t)i * N + j] = sa;
        }
}

/* every element within (K+2) float roundings of the sum of |products| */
static void check_gemm(const char *what, const float *C, const float *C0, const double *ref,
                       const double *absref, double alpha, int M, int N, int K) {
    for (size_t i = 0; i < (size_t)M * N; i++) {
        double want = (C0 ? C0[i] : 0.0) + alpha * ref[i];
        double bound = (K + 4) * FLT_EPSILON * (fabs(alpha) * absref[i] + (C0 ? fabs(C0[i]) : 0));
        if (!(fabs(C[i] - want) <= bound + 1e-30)) {
            T_FAIL("%s: element %zu = %.9g, want %.9g (bound %.3g)", what, i, C[i], want, bound);
            return;
        }
    }
}

static const int gemm_shapes[][3] = {{13, 17, 19}, {64, 48, 80}, {1, 5, 3}, {33, 1, 70}};

static void test_gemm_f32(void) {
    for (size_t s = 0; s < sizeof gemm_shapes / sizeof gemm_shapes[0]; s++) {
        int M = gemm_shapes[s][0], N = gemm_shapes[s][1], K = gemm_shapes[s][2];
        for (int combo = 0; combo < 8; combo++) {
            int ta = combo & 1, tb = (combo >> 1) & 1, acc = (combo >> 2) & 1;
            float *A = dev_rand((size_t)M * K, -1, 1), *B = dev_rand((size_t)K * N, -1, 1);
            float *C = dev_rand((size_t)M * N, -1, 1);
            float *C0 = acc ? dev_copy(C, (size_t)M * N) : NULL;
            if (!acc) C[0] = NAN; /* overwrite must not read C */
            double *ref = malloc(sizeof(double) * M * N),
                   *absref = malloc(sizeof(double) * M * N);
            gemm_ref(ref, absref, A, B, M, N, K, ta, tb);
            OPS->gemm_f32(be, C, A, B, M, N, K, ta, tb, acc);
            char what[96];
            snprintf(what, sizeof what, "gemm_f32 %dx%dx%d transA=%d transB=%d acc=%d", M, N, K,
                     ta, tb, acc);
            check_gemm(what, C, C0, ref, absref, 1.0, M, N, K);
            free(ref);
            free(absref);
            OPS->free(be, A);
            OPS->free(be, B);
            OPS->free(be, C);
            if (C0) OPS->free(be, C0);
        }
    }
}

static float bf16r(float x) { return bf16_decode(bf16_encode(x)); }

static void test_gemm_bf16(void) {
    for (size_t s = 0; s < sizeof gemm_shapes / sizeof gemm_shapes[0]; s++) {
        int M = gemm_shapes[s][0], N = gemm_shapes[s][1], K = gemm_shapes[s][2];
        for (int combo = 0; combo < 8; combo++) {
            int ta = combo & 1, tb = (combo >> 1) & 1, acc = (combo >> 2) & 1;
            size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
            float *A = dev_rand(na, -3, 3), *B = dev_rand(nb, -3, 3), *C = dev_rand(nc, -1, 1);
            float *C0 = dev_copy(C, nc);
            float *Ar = malloc(na * sizeof(float)), *Br = malloc(nb * sizeof(float));
            for (size_t i = 0; i < na; i++) Ar[i] = bf16r(A[i]);
            for (size_t i = 0; i < nb; i++) Br[i] = bf16r(B[i]);
            /* the direct composition: sgemm of the BF16-rounded operands */
            float *Cw = malloc(nc * sizeof(float));
            memcpy(Cw, C0, nc * sizeof(float));
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, Ar, ta ? M : K, Br,
                        tb ? K : N, acc ? 1.0f : 0.0f, Cw, N);
            /* amaxes recorded by the GEMM: max-accumulated into the running values (the
             * starting value wins when larger) */
            float am[2] = {0.5f, 100.0f}, ea = 0.5f, eb = 100.0f;
            for (size_t i = 0; i < na; i++) ea = fmaxf(ea, fabsf(A[i]));
            for (size_t i = 0; i < nb; i++) eb = fmaxf(eb, fabsf(B[i]));
            OPS->gemm_bf16(be, C, A, B, M, N, K, ta, tb, acc, &am[0], &am[1]);
            T_CHECK(am[0] == ea && am[1] == eb, "gemm_bf16 amax %g %g, expected %g %g", am[0],
                    am[1], ea, eb);
            char what[96];
            snprintf(what, sizeof what, "gemm_bf16 %dx%dx%d transA=%d transB=%d acc=%d", M, N, K,
                     ta, tb, acc);
            T_CHECK(bits_equal(C, Cw, nc * sizeof(float)),
                    "%s: differs from sgemm of rounded "
                    "operands",
                    what);
            /* and the layout against a double reference of the rounded operands */
            double *ref = malloc(sizeof(double) * nc), *absref = malloc(sizeof(double) * nc);
            gemm_ref(ref, absref, Ar, Br, M, N, K, ta, tb);
            check_gemm(what, C, acc ? C0 : NULL, ref, absref, 1.0, M, N, K);
            /* the rounding matters: the unrounded product is measurably different */
            if (K >= 19 && !acc) {
                double *ref32 = malloc(sizeof(double) * nc);
                gemm_ref(ref32, absref, A, B, M, N, K, ta, tb);
                double maxdiff = 0;
                for (size_t i = 0; i < nc; i++) maxdiff = fmax(maxdiff, fabs(ref32[i] - C[i]));
                T_CHECK(maxdiff > 1e-4, "%s: BF16 GEMM indistinguishable from FP32 (%g)", what,
                        maxdiff);
                free(ref32);
            }
            free(ref);
            free(absref);
            free(Ar);
            free(Br);
            free(Cw);
            OPS->free(be, A);
            OPS->free(be, B);
            OPS->free(be, C);
            OPS->free(be, C0);
        }
    }
}

/* FP8 operand with values decode(encode(x * scale)) for x in [-r, r] */
static uint8_t *fp8_rand_codes(size_t n, fp8_format fmt, float range, float scale) {
    uint8_t *codes = OPS->malloc(be, n);
    for (size_t i = 0; i < n; i++)
        codes[i] = fp8_encode(rng_float(-range, range) * scale, fmt, 1);
    return codes;
}

static void test_gemm_fp8(void) {
    const float sinv_a[] = {0.5f, 0.3f, 1.0f / 448.0f};
    const float sinv_b[] = {0.03125f, 1.7f, 2.0f};
    for (size_t s = 0; s < sizeof gemm_shapes / sizeof gemm_shapes[0]; s++) {
        int M = gemm_shapes[s][0], N = gemm_shapes[s][1], K = gemm_shapes[s][2];
        for (int combo = 0; combo < 16; combo++) {
            int ta = combo & 1, tb = (combo >> 1) & 1, acc = (combo >> 2) & 1;
            int use_t = (combo >> 3) & 1; /* pass only data_t (transposed copy) */
            fp8_format fa = (combo % 3 == 0) ? FP8_E5M2 : FP8_E4M3;
            fp8_format fb = (combo % 2 == 0) ? FP8_E4M3 : FP8_E5M2;
            size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
            float *sa = dev_floats(1), *sb = dev_floats(1);
            *sa = sinv_a[combo % 3];
            *sb = sinv_b[(combo / 3) % 3];
            uint8_t *ca = fp8_rand_codes(na, fa, 2.0f, 100.0f);
            uint8_t *cb = fp8_rand_codes(nb, fb, 2.0f, 100.0f);
            /* stored layouts: A [K,M] when transA, else [M,K]; B [N,K] when transB */
            int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
            uint8_t *ca_t = OPS->malloc(be, na), *cb_t = OPS->malloc(be, nb);
            for (int i = 0; i < ar; i++)
                for (int j = 0; j < ac; j++) ca_t[(size_t)j * ar + i] = ca[(size_t)i * ac + j];
            for (int i = 0; i < br; i++)
                for (int j = 0; j < bc; j++) cb_t[(size_t)j * br + i] = cb[(size_t)i * bc + j];
            fp8t_fp8_operand A = {use_t ? NULL : ca,  use_t ? ca_t : NULL, sa, fa, ar, ac,
                                  FP8T_SCALING_TENSOR};
            fp8t_fp8_operand B = {use_t ? NULL : cb,  use_t ? cb_t : NULL, sb, fb, br, bc,
                                  FP8T_SCALING_TENSOR};
            /* the reference: decode each code with fp8_decode, product in double, times the
             * scale_invs */
            float *Ad = malloc(na * sizeof(float)), *Bd = malloc(nb * sizeof(float));
            for (size_t i = 0; i < na; i++) Ad[i] = fp8_decode(ca[i], fa);
            for (size_t i = 0; i < nb; i++) Bd[i] = fp8_decode(cb[i], fb);
            double *ref = malloc(sizeof(double) * nc), *absref = malloc(sizeof(double) * nc);
            gemm_ref(ref, absref, Ad, Bd, M, N, K, ta, tb);
            float *C = dev_rand(nc, -5, 5), *C0 = dev_copy(C, nc);
            float *amax = dev_floats(1);
            *amax = 1e-3f;
            OPS->gemm_fp8(be, C, &A, &B, M, N, K, ta, tb, acc, combo & 1, amax, NULL);
            char what[128];
            snprintf(what, sizeof what,
                     "gemm_fp8 %dx%dx%d transA=%d transB=%d acc=%d data_t_only=%d %s*%s", M, N, K,
                     ta, tb, acc, use_t, fp8_format_name(fa), fp8_format_name(fb));
            double alpha = (double)(*sa) * (double)(*sb);
            check_gemm(what, C, acc ? C0 : NULL, ref, absref, alpha, M, N, K);
            float want_amax = 1e-3f;
            for (size_t i = 0; i < nc; i++) want_amax = fmaxf(want_amax, fabsf(C[i]));
            T_CHECK(*amax == want_amax, "%s: amax_out %g, want %g", what, *amax, want_amax);
            free(Ad);
            free(Bd);
            free(ref);
            free(absref);
            OPS->free(be, sa);
            OPS->free(be, sb);
            OPS->free(be, ca);
            OPS->free(be, cb);
            OPS->free(be, ca_t);
            OPS->free(be, cb_t);
            OPS->free(be, C);
            OPS->free(be, C0);
            OPS->free(be, amax);
        }
    }
}

/* FP8 GEMM of quantized float tensors equals the GEMM of their dequantized values, and a large
 * prior amax is kept (max-accumulate). */
static void test_gemm_fp8_composition(void) {
    int M = 24, N = 40, K = 56;
    float *X = dev_rand((size_t)M * K, -4, 4), *W = dev_rand((size_t)N * K, -0.2f, 0.2f);
    float xs = 448.0f / 4.0f, ws = 448.0f / 0.2f;
    uint8_t *xc = OPS->malloc(be, (size_t)M * K), *wc = OPS->malloc(be, (size_t)N * K);
    for (size_t i = 0; i < (size_t)M * K; i++) xc[i] = fp8_encode(X[i] * xs, FP8_E4M3, 1);
    for (size_t i = 0; i < (size_t)N * K; i++) wc[i] = fp8_encode(W[i] * ws, FP8_E4M3, 1);
    float *sx = dev_floats(1), *sw = dev_floats(1), *amax = dev_floats(1),
          *Y = dev_floats((size_t)M * N);
    *sx = 1.0f / xs;
    *sw = 1.0f / ws;
    *amax = 1e6f;
    fp8t_fp8_operand A = {xc, NULL, sx, FP8_E4M3, M, K, FP8T_SCALING_TENSOR},
                     B = {wc, NULL, sw, FP8_E4M3, N, K, FP8T_SCALING_TENSOR};
    OPS->gemm_fp8(be, Y, &A, &B, M, N, K, 0, 1, 0, 0, amax, NULL); /* Fprop Y = X·Wᵀ */
    T_CHECK(*amax == 1e6f, "amax_out must max-accumulate, got %g", *amax);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, sa = 0;
            for (int k = 0; k < K; k++) {
                double a = (double)fp8_decode(xc[i * K + k], FP8_E4M3) * (double)*sx;
                double bb = (double)fp8_decode(wc[j * K + k], FP8_E4M3) * (double)*sw;
                s += a * bb;
                sa += fabs(a * bb);
            }
            T_CLOSE(Y[i * N + j], s, (K + 4) * FLT_EPSILON * sa, 0);
        }
    OPS->free(be, X);
    OPS->free(be, W);
    OPS->free(be, xc);
    OPS->free(be, wc);
    OPS->free(be, sx);
    OPS->free(be, sw);
    OPS->free(be, amax);
    OPS->free(be, Y);
}

/* ================================ quantization ================================ */

static void test_amax(void) {
    size_t n = 100003;
    float *x = dev_rand(n, -3, 3), *out = dev_floats(1);
    x[777] = -9.5f;
    *out = 0.0f;
    OPS->amax(be, out, x, n);
    T_CHECK(*out == 9.5f, "amax %g want 9.5", *out);
    *out = 20.0f;
    OPS->amax(be, out, x, n);
    T_CHECK(*out == 20.0f, "amax must max-accumulate: %g", *out);
    x[50000] = NAN;
    *out = 0.0f;
    OPS->amax(be, out, x, n);
    T_CHECK(isnan(*out), "NaN must propagate: %g", *out);
    x[50000] = 0.0f;
    *out = NAN;
    OPS->amax(be, out, x, n);
    T_CHECK(isnan(*out), "a NaN already in amax_out must stay: %g", *out);
    OPS->free(be, x);
    OPS->free(be, out);
}

static void test_quantize(void) {
    const int shapes[][2] = {{37, 45}, {1, 7}, {64, 128}, {300, 257}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int f = 0; f < 2; f++) {
            int rows = shapes[s][0], cols = shapes[s][1];
            size_t n = (size_t)rows * cols;
            fp8_format fmt = f ? FP8_E5M2 : FP8_E4M3;
            float *x = dev_rand(n, -2, 2);
            x[n / 2] = 1000.0f; /* saturates after scaling */
            float *scale = dev_floats(1), *amax = dev_floats(1);
            *scale = f ? 30000.0f : 300.0f;
            *amax = 0.5f;
            uint8_t *codes = OPS->malloc(be, n), *codes_t = OPS->malloc(be, n);
            t_quantize(be, codes, codes_t, amax, x, rows, cols, fmt, scale);
            int bad = 0, bad_t = 0;
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < cols; c++) {
                    uint8_t want = fp8_encode(x[(size_t)r * cols + c] * *scale, fmt, 1);
                    bad += codes[(size_t)r * cols + c] != want;
                    bad_t += codes_t[(size_t)c * rows + r] != want;
                }
            T_CHECK(bad == 0 && bad_t == 0, "%dx%d %s: %d codes and %d transposed codes differ",
                    rows, cols, fp8_format_name(fmt), bad, bad_t);
            T_CHECK(*amax == 1000.0f, "amax %g want 1000", *amax);
            T_CHECK(codes[n / 2] == fp8_encode(fp8_format_max(fmt), fmt, 0), "no saturation");
            /* without the optional outputs, and with only the transposed one */
            uint8_t *c2 = OPS->malloc(be, n), *t2 = OPS->malloc(be, n);
            t_quantize(be, c2, NULL, NULL, x, rows, cols, fmt, scale);
            T_CHECK(bits_equal(c2, codes, n), "codes without codes_t differ");
            t_quantize(be, NULL, t2, NULL, x, rows, cols, fmt, scale);
            T_CHECK(bits_equal(t2, codes_t, n), "codes_t without codes differ");
            x[3] = NAN;
            t_quantize(be, c2, NULL, amax, x, rows, cols, fmt, scale);
            T_CHECK(isnan(*amax), "NaN input must make amax NaN (%g)", *amax);
            OPS->free(be, x);
            OPS->free(be, scale);
            OPS->free(be, amax);
            OPS->free(be, codes);
            OPS->free(be, codes_t);
            OPS->free(be, c2);
            OPS->free(be, t2);
        }
}

static void test_compute_scale(void) {
    const float amaxes[] = {0.0f, 1e-30f, 3.7f, 448.0f, 1e5f, INFINITY, NAN};
    float *scale = dev_floats(1), *scale_inv = dev_floats(1), *amax = dev_floats(1);
    for (size_t i = 0; i < sizeof amaxes / sizeof amaxes[0]; i++)
        for (int pow2 = 0; pow2 < 2; pow2++)
            for (int f = 0; f < 2; f++) {
                float fmax = f ? FP8_E5M2_MAX : FP8_E4M3_MAX;
                *amax = amaxes[i];
                OPS->compute_scale(be, scale, scale_inv, amax, fmax, 1e-12f, pow2);
                float want = fp8t_current_scale(amaxes[i], fmax, 1e-12f, pow2);
                T_CHECK(*scale == want, "amax %g pow2 %d: scale %g want %g", amaxes[i], pow2,
                        *scale, want);
                T_CHECK(*scale_inv == 1.0f / want, "scale_inv %g want %g", *scale_inv,
                        1.0f / want);
            }
    OPS->free(be, scale);
    OPS->free(be, scale_inv);
    OPS->free(be, amax);
}

static void test_fake_quantize(void) {
    size_t n = 70001;
    for (int f = 0; f < 2; f++) {
        fp8_format fmt = f ? FP8_E5M2 : FP8_E4M3;
        float *x = dev_rand(n, -10, 10), *out = dev_floats(n), *scale = dev_floats(1);
        *scale = f ? 5000.0f : 40.0f;
        float *want = malloc(n * sizeof(float));
        fp8_fake_quantize(want, x, n, *scale, fmt);
        OPS->fake_quantize(be, out, x, n, fmt, scale);
        T_CHECK(bits_equal(out, want, n * sizeof(float)), "%s fake_quantize differs",
                fp8_format_name(fmt));
        int changed = 0;
        for (size_t i = 0; i < n; i++) changed += out[i] != x[i];
        T_CHECK(changed > 0, "fake quantization changed nothing");
        OPS->fake_quantize(be, x, x, n, fmt, scale); /* in place */
        T_CHECK(bits_equal(x, want, n * sizeof(float)), "in-place fake_quantize differs");
        free(want);
        OPS->free(be, x);
        OPS->free(be, out);
        OPS->free(be, scale);
    }
}

/* block_quantize against the reference quantizer on the operand's own layout: the codes, and
 * scale_inv = 1 / the reference's scale at the layout's index, bit for bit (the three tile
 * kinds: 1x128, 128x128 and ROW's 1 x K, transposed or not, partial edge blocks, pow2 on and
 * off, both formats) */
static void test_block_quantize(void) {
    const int cfg[][2] = {{300, 260}, {256, 384}, {5, 7}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
        for (int kind = 1; kind <= 3; kind++)
            for (int t = 0; t < 2; t++)
                for (int pow2 = 0; pow2 < 2; pow2++)
                    for (int f = 0; f < 2; f++) {
                        const int rows = cfg[c][0], cols = cfg[c][1];
                        const fp8t_fp8_scaling k = (fp8t_fp8_scaling)kind;
                        const fp8_format fmt = f ? FP8_E5M2 : FP8_E4M3;
                        const size_t n = (size_t)rows * cols;
                        float *x = dev_rand(n, -1, 1);
                        for (size_t i = 0; i < n; i += 97) x[i] *= 300.0f;
                        x[n / 2] = 0.0f;
                        const int R = t ? cols : rows, K = t ? rows : cols;
                        float *op = malloc(n * sizeof(float)); /* the operand [R, K] */
                        for (int r = 0; r < R; r++)
                            for (int q = 0; q < K; q++)
                                op[(size_t)r * K + q] =
                                    t ? x[(size_t)q * cols + r] : x[(size_t)r * cols + q];
                        const int tr = k == FP8T_SCALING_BLK128 ? 128 : 1;
                        const int tc = k == FP8T_SCALING_ROW ? K : 128;
                        const int nbr = (R + tr - 1) / tr, nbc = (K + tc - 1) / tc;
                        uint8_t *want = malloc(n), *codes = OPS->malloc(be, n);
                        float *sc = malloc((size_t)nbr * nbc * sizeof(float));
                        const size_t ns = fp8t_block_scale_floats(k, R, K);
                        float *sinv = dev_floats(ns);
                        fp8t_block_quantize_pow2(want, sc, op, R, K, tr, tc, fmt, pow2);
                        t_block_quantize(be, codes, sinv, x, rows, cols, t, k, fmt, pow2);
                        T_CHECK(bits_equal(codes, want, n),
                                "block_quantize codes %dx%d kind %d t %d pow2 %d %s", rows, cols,
                                kind, t, pow2, fp8_format_name(fmt));
                        int bad = 0;
                        for (int br = 0; br < nbr; br++)
                            for (int bc = 0; bc < nbc; bc++) {
                                float w = 1.0f / sc[(size_t)br * nbc + bc];
                                float g = sinv[fp8t_block_scale_index(k, R, K, br * tr, bc * tc)];
                                bad += !bits_equal(&w, &g, sizeof(float));
                            }
                        T_CHECK(bad == 0, "block_quantize scale_inv: %d blocks differ", bad);
                        free(op);
                        free(want);
                        free(sc);
                        OPS->free(be, codes);
                        OPS->free(be, sinv);
                        OPS->free(be, x);
                    }
}

/* gemm_fp8 on block-scaled operands, the three linear GEMMs in the operand forms the model
 * gives them (A [M,K] 1x128, B [N,K] 1x128 or 128x128). With power-of-two scales
 * code * scale_inv equals the emulation's code / scale, so the op must equal today's
 * emulation (block_fake_quantize per operand, gemm_f32) bit for bit; with plain scales the two
 * decodes differ by at most an ulp per element, checked against a double reference of the
 * emulation within 4 * 2^-24 * sum |a||b| + K * 2^-24 * sum |a||b| (FP32 sums). */
static void test_gemm_fp8_block(void) {
    /* M, N, K, B kind (1: 1x128, 2: 128x128) */
    const int cfg[][4] = {{64, 48, 256, 2}, {33, 130, 300, 2}, {40, 72, 384, 1}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
        for (int pow2 = 0; pow2 < 2; pow2++)
            for (int acc = 0; acc < 2; acc++) {
                const int M = cfg[c][0], N = cfg[c][1], K = cfg[c][2];
                const fp8t_fp8_scaling kb = (fp8t_fp8_scaling)cfg[c][3];
                float *a = dev_rand((size_t)M * K, -2, 2), *b = dev_rand((size_t)N * K, -1, 1);
                for (size_t i = 0; i < (size_t)M * K; i += 61) a[i] *= 50.0f;
                uint8_t *ca = OPS->malloc(be, (size_t)M * K),
                        *cb = OPS->malloc(be, (size_t)N * K);
                float *sa = dev_floats(fp8t_block_scale_floats(FP8T_SCALING_VEC128, M, K));
                float *sb = dev_floats(fp8t_block_scale_floats(kb, N, K));
                t_block_quantize(be, ca, sa, a, M, K, 0, FP8T_SCALING_VEC128, FP8_E4M3, pow2);
                t_block_quantize(be, cb, sb, b, N, K, 0, kb, FP8_E4M3, pow2);
                fp8t_fp8_operand A = {ca, NULL, sa, FP8_E4M3, M, K, FP8T_SCALING_VEC128};
                fp8t_fp8_operand B = {cb, NULL, sb, FP8_E4M3, N, K, kb};
                float *c0 = dev_rand((size_t)M * N, -1, 1);
                float *got = dev_copy(c0, (size_t)M * N), *want = dev_copy(c0, (size_t)M * N);
                OPS->gemm_fp8(be, got, &A, &B, M, N, K, 0, 1, acc, 0, NULL, NULL);
                /* the emulation: each operand quantized and dequantized per block (codes /
                 * scale), FP32 GEMM */
                float *ea = dev_floats((size_t)M * K), *eb = dev_floats((size_t)N * K);
                const int tb = kb == FP8T_SCALING_VEC128 ? 1 : 128;
                float *sca = malloc((size_t)M * ((K + 127) / 128) * sizeof(float));
                float *scb = malloc((size_t)((N + tb - 1) / tb) * ((K + 127) / 128) * 4);
                uint8_t *qa = malloc((size_t)M * K), *qb = malloc((size_t)N * K);
                fp8t_block_quantize_pow2(qa, sca, a, M, K, 1, 128, FP8_E4M3, pow2);
                fp8t_block_dequantize(ea, qa, sca, M, K, 1, 128, FP8_E4M3);
                fp8t_block_quantize_pow2(qb, scb, b, N, K, tb, 128, FP8_E4M3, pow2);
                fp8t_block_dequantize(eb, qb, scb, N, K, tb, 128, FP8_E4M3);
                if (!pow2) { /* the model's emulation op itself (no pow2 there) */
                    float *fa = dev_floats((size_t)M * K);
                    OPS->block_fake_quantize(be, fa, a, M, K, 1, 128, FP8_E4M3);
                    T_CHECK(bits_equal(fa, ea, (size_t)M * K * 4), "emulation differs");
                    OPS->free(be, fa);
                }
                OPS->gemm_f32(be, want, ea, eb, M, N, K, 0, 1, acc);
                if (pow2) {
                    T_CHECK(bits_equal(got, want, (size_t)M * N * sizeof(float)),
                            "block gemm %dx%dx%d kind %d acc %d: not the emulation's bits", M, N,
                            K, (int)kb, acc);
                } else {
                    double worst = 0.0;
                    for (int i = 0; i < M; i++)
                        for (int j = 0; j < N; j++) {
                            double ref = acc ? c0[(size_t)i * N + j] : 0.0, mag = 0.0;
                            for (int q = 0; q < K; q++) {
                                double p = (double)ea[(size_t)i * K + q] * eb[(size_t)j * K + q];
                                ref += p;
                                mag += fabs(p);
                            }
                            if (acc) mag += fabs(c0[(size_t)i * N + j]);
                            double tol = (4.0 + K + 1) * ldexp(1.0, -24) * mag + 1e-30;
                            double e = fabs(got[(size_t)i * N + j] - ref) / tol;
                            if (e > worst) worst = e;
                        }
                    T_CHECK(worst <= 1.0, "block gemm %dx%dx%d: %.3g of the tolerance", M, N, K,
                            worst);
                }
                free(sca);
                free(scb);
                free(qa);
                free(qb);
                OPS->free(be, ea);
                OPS->free(be, eb);
                OPS->free(be, a);
                OPS->free(be, b);
                OPS->free(be, ca);
                OPS->free(be, cb);
                OPS->free(be, sa);
                OPS->free(be, sb);
                OPS->free(be, c0);
                OPS->free(be, got);
                OPS->free(be, want);
            }
}

static void test_block_fake_quantize(void) {
    const int cfg[][4] = {{300, 260, 1, 128}, {300, 260, 128, 128}, {5, 7, 1, 128}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
        for (int f = 0; f < 2; f++) {
            int rows = cfg[c][0], cols = cfg[c][1], tr = cfg[c][2], tc = cfg[c][3];
            fp8_format fmt = f ? FP8_E5M2 : FP8_E4M3;
            size_t n = (size_t)rows * cols;
            float *x = dev_rand(n, -1, 1), *out = dev_floats(n);
            for (size_t i = 0; i < n; i += 97) x[i] *= 300.0f; /* per-block ranges differ */
            size_t nb = (size_t)((rows + tr - 1) / tr) * ((cols + tc - 1) / tc);
            uint8_t *codes = malloc(n);
            float *scales = malloc(nb * sizeof(float)), *want = malloc(n * sizeof(float));
            fp8t_block_quantize(codes, scales, x, rows, cols, tr, tc, fmt);
            fp8t_block_dequantize(want, codes, scales, rows, cols, tr, tc, fmt);
            OPS->block_fake_quantize(be, out, x, rows, cols, tr, tc, fmt);
            T_CHECK(bits_equal(out, want, n * sizeof(float)),
                    "block %dx%d tiles %dx%d %s differs", rows, cols, tr, tc,
                    fp8_format_name(fmt));
            OPS->block_fake_quantize(be, x, x, rows, cols, tr, tc, fmt);
            T_CHECK(bits_equal(x, want, n * sizeof(float)), "in-place block fake quant differs");
            free(codes);
            free(scales);
            free(want);
            OPS->free(be, x);
            OPS->free(be, out);
        }
}

static void test_mxfp8_fake_quantize(void) {
    const int shapes[][2] = {{17, 100}, {64, 64}, {3, 5}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int rows = shapes[s][0], cols = shapes[s][1];
        size_t n = (size_t)rows * cols, ns = (size_t)rows * ((cols + 31) / 32);
        float *x = dev_rand(n, -1, 1), *out = dev_floats(n);
        for (size_t i = 0; i < n; i += 13) x[i] *= 1000.0f;
        uint8_t *codes = malloc(n), *e8 = malloc(ns);
        float *want = malloc(n * sizeof(float));
        fp8t_mxfp8_quantize(codes, e8, x, rows, cols);
        fp8t_mxfp8_dequantize(want, codes, e8, rows, cols);
        OPS->mxfp8_fake_quantize(be, out, x, rows, cols);
        T_CHECK(bits_equal(out, want, n * sizeof(float)), "mxfp8 %dx%d differs", rows, cols);
        free(codes);
        free(e8);
        free(want);
        OPS->free(be, x);
        OPS->free(be, out);
    }
}

static void test_bf16_round(void) {
    size_t n = 50000;
    float *x = dev_rand(n, -100, 100), *out = dev_floats(n);
    x[0] = NAN;
    x[1] = INFINITY;
    x[2] = -0.0f;
    OPS->bf16_round(be, out, x, n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float w = bf16_decode(bf16_encode(x[i]));
        bad += !(memcmp(&w, &out[i], 4) == 0 || (isnan(w) && isnan(out[i])));
    }
    T_CHECK(bad == 0, "%d elements differ from bf16_decode(bf16_encode(x))", bad);
    OPS->bf16_round(be, x, x, n);
    T_CHECK(memcmp(x + 1, out + 1, (n - 1) * sizeof(float)) == 0, "in-place bf16_round differs");
    OPS->free(be, x);
    OPS->free(be, out);
}

static void test_delayed_update(void) {
    int n = 7, len = 5;
    size_t nf = fp8t_recipe_state_floats(n, len);
    float *dev = dev_floats(nf), *host = malloc(nf * sizeof(float));
    fp8t_recipe_state st;
    fp8t_recipe_state_view(&st, dev, n, len);
    fp8_format fmts[7] = {FP8_E4M3, FP8_E5M2, FP8_E4M3, FP8_E4M3, FP8_E5M2, FP8_E4M3, FP8_E4M3};
    fp8t_recipe_state_reset(&st, fmts);
    for (int i = 0; i < len; i++)
        for (int t = 0; t < n; t++) st.history[i * n + t] = rng_float(0, 10);
    st.history[0 * n + 3] = 0.0f; /* a tensor that saw only zeros this step */
    for (int i = 0; i < len; i++) st.history[i * n + 5] = 0.0f; /* all-zero history */
    st.history[2 * n + 6] = NAN;
    for (int algo = 0; algo < 2; algo++)
        for (int margin = 0; margin < 2; margin++) {
            memcpy(host, dev, nf * sizeof(float));
            fp8t_recipe_state hs;
            fp8t_recipe_state_view(&hs, host, n, len);
            fp8t_delayed_update(&hs, (fp8t_amax_algo)algo, margin);
            OPS->delayed_update(be, dev, n, len, (fp8t_amax_algo)algo, margin);
            T_CHECK(memcmp(host, dev, nf * sizeof(float)) == 0,
                    "algo %d margin %d: state differs from fp8t_delayed_update", algo, margin);
        }
    OPS->free(be, dev);
    free(host);
}

/* ================================ model ops ================================ */

/* ---- embedding ---- */
typedef struct {
    int B, T, C, V;
    const int *tok;
    int use_wpe;
} emb_ctx;

static void emb_ref(double *out, double **in, const void *vctx) {
    const emb_ctx *c = vctx;
    for (int i = 0; i < c->B * c->T; i++)
        for (int k = 0; k < c->C; k++)
            out[i * c->C + k] =
                in[0][c->tok[i] * c->C + k] + (c->use_wpe ? in[1][(i % c->T) * c->C + k] : 0.0);
}

static void test_embedding(void) {
    for (int use_wpe = 0; use_wpe < 2; use_wpe++) {
        int B = 2, T = 5, C = 6, V = 4, N = B * T;
        int *tok = OPS->malloc(be, N * sizeof(int));
        for (int i = 0; i < N; i++) tok[i] = rng_int(V); /* repeats guaranteed */
        float *wte = dev_rand((size_t)V * C, -1, 1), *wpe = dev_rand((size_t)T * C, -1, 1);
        float *out = dev_floats((size_t)N * C);
        OPS->embedding_forward(be, out, tok, wte, use_wpe ? wpe : NULL, B, T, C);
        emb_ctx ctx = {B, T, C, V, tok, use_wpe};
        double *in[2] = {to_double(wte, (size_t)V * C), to_double(wpe, (size_t)T * C)};
        double *ref = calloc((size_t)N * C, sizeof(double));
        emb_ref(ref, in, &ctx);
        check_close("embedding_forward", out, ref, (size_t)N * C, 0, 0);
        /* backward accumulates into existing gradients */
        double *r = malloc(sizeof(double) * N * C);
        float *dout = dev_floats((size_t)N * C);
        for (int i = 0; i < N * C; i++) dout[i] = (float)(r[i] = rng_float(-1, 1));
        float *dwte = dev_rand((size_t)V * C, -1, 1), *dwpe = dev_rand((size_t)T * C, -1, 1);
        float *dwte0 = dev_copy(dwte, (size_t)V * C), *dwpe0 = dev_copy(dwpe, (size_t)T * C);
        OPS->embedding_backward(be, dwte, use_wpe ? dwpe : NULL, dout, tok, B, T, C);
        double *g =
            malloc(sizeof(double) * V * C > sizeof(double) * T * C ? sizeof(double) * V * C
                                                                   : sizeof(double) * T * C);
        fd_grad(g, emb_ref, &ctx, in, 0, (size_t)V * C, (size_t)N * C, r);
        check_grad("embedding dwte", dwte, dwte0, g, (size_t)V * C, 1e-5);
        if (use_wpe) {
            fd_grad(g, emb_ref, &ctx, in, 1, (size_t)T * C, (size_t)N * C, r);
            check_grad("embedding dwpe", dwpe, dwpe0, g, (size_t)T * C, 1e-5);
        } else {
            T_CHECK(bits_equal(dwpe, dwpe0, (size_t)T * C * 4), "dwpe touched with NULL");
        }
        free(in[0]);
        free(in[1]);
        free(ref);
        free(r);
        free(g);
        OPS->free(be, tok);
        OPS->free(be, wte);
        OPS->free(be, wpe);
        OPS->free(be, out);
        OPS->free(be, dout);
        OPS->free(be, dwte);
        OPS->free(be, dwpe);
        OPS->free(be, dwte0);
        OPS->free(be, dwpe0);
    }
}

/* ---- layernorm / rmsnorm ---- */
typedef struct {
    int N, C;
    double eps;
    int rms;
} norm_ctx;

static void norm_ref(double *out, double **in, const void *vctx) {
    const norm_ctx *c = vctx;
    for (int r = 0; r < c->N; r++) {
        const double *x = in[0] + (size_t)r * c->C;
        double m = 0, v = 0;
        if (!c->rms) {
            for (int k = 0; k < c->C; k++) m += x[k];
            m /= c->C;
        }
        for (int k = 0; k < c->C; k++) v += (x[k] - m) * (x[k] - m);
        double rs = 1.0 / sqrt(v / c->C + c->eps);
        for (int k = 0; k < c->C; k++)
            out[(size_t)r * c->C + k] = (x[k] - m) * rs * in[1][k] + (c->rms ? 0.0 : in[2][k]);
    }
}

static void test_norm(int rms) {
    int N = 6, C = 20;
    float eps = 1e-5f;
    size_t nx = (size_t)N * C;
    float *x = dev_rand(nx, -2, 2), *w = dev_rand(C, 0.5f, 1.5f), *bias = dev_rand(C, -1, 1);
    for (int k = 0; k < C; k++) x[C + k] += 3.0f; /* a row with a large mean */
    float *out = dev_floats(nx), *mean = dev_floats(N), *rstd = dev_floats(N);
    if (rms)
        OPS->rmsnorm_forward(be, out, rstd, x, w, N, C, eps);
    else
        OPS->layernorm_forward(be, out, mean, rstd, x, w, bias, N, C, eps);
    norm_ctx ctx = {N, C, eps, rms};
    double *in[3] = {to_double(x, nx), to_double(w, C), to_double(bias, C)};
    double *ref = calloc(nx, sizeof(double));
    norm_ref(ref, in, &ctx);
    check_close(rms ? "rmsnorm_forward" : "layernorm_forward", out, ref, nx, 1e-5, 1e-5);
    for (int r = 0; r < N; r++) { /* saved statistics */
        double m = 0, v = 0;
        for (int k = 0; k < C; k++) m += in[0][r * C + k];
        m = rms ? 0 : m / C;
        for (int k = 0; k < C; k++) v += (in[0][r * C + k] - m) * (in[0][r * C + k] - m);
        if (!rms) T_CLOSE(mean[r], m, 1e-6, 1e-6);
        T_CLOSE(rstd[r], 1.0 / sqrt(v / C + eps), 0, 1e-6);
    }
    double *r = malloc(sizeof(double) * nx), *g = malloc(sizeof(double) * nx);
    float *dout = dev_floats(nx);
    for (size_t i = 0; i < nx; i++) dout[i] = (float)(r[i] = rng_float(-1, 1));
    float *dx = dev_rand(nx, -1, 1), *dw = dev_rand(C, -1, 1), *db = dev_rand(C, -1, 1);
    float *dx0 = dev_copy(dx, nx), *dw0 = dev_copy(dw, C), *db0 = dev_copy(db, C);
    if (rms)
        OPS->rmsnorm_backward(be, dx, dw, dout, x, NULL, w, rstd, N, C);
    else
        OPS->layernorm_backward(be, dx, dw, db, dout, x, NULL, w, mean, rstd, N, C);
    fd_grad(g, norm_ref, &ctx, in, 0, nx, nx, r);
    check_grad(rms ? "rmsnorm dx" : "layernorm dx", dx, dx0, g, nx, 1e-4);
    fd_grad(g, norm_ref, &ctx, in, 1, C, nx, r);
    check_grad(rms ? "rmsnorm dw" : "layernorm dw", dw, dw0, g, C, 1e-4);
    if (!rms) {
        fd_grad(g, norm_ref, &ctx, in, 2, C, nx, r);
        check_grad("layernorm dbias", db, db0, g, C, 1e-4);
    }
    /* x from its BF16 copy: the bits of the backward of that copy widened */
    {
        uint16_t *x16 = (uint16_t *)OPS->malloc(be, nx * sizeof(uint16_t));
        float *xw = dev_floats(nx);
        OPS->bf16_pack(be, x16, x, NULL, N, C);
        OPS->bf16_unpack(be, xw, x16, nx);
        float *a[2][3];
        for (int v = 0; v < 2; v++) {
            a[v][0] = dev_copy(dx0, nx), a[v][1] = dev_copy(dw0, C), a[v][2] = dev_copy(db0, C);
            if (rms)
                OPS->rmsnorm_backward(be, a[v][0], a[v][1], dout, v ? xw : NULL, v ? NULL : x16,
                                      w, rstd, N, C);
            else
                OPS->layernorm_backward(be, a[v][0], a[v][1], a[v][2], dout, v ? xw : NULL,
                                        v ? NULL : x16, w, mean, rstd, N, C);
        }
        T_CHECK(!memcmp(a[0][0], a[1][0], nx * 4) && !memcmp(a[0][1], a[1][1], C * 4) &&
                    !memcmp(a[0][2], a[1][2], C * 4),
                "%s backward from x's BF16 copy = from the copy widened", rms ? "rms" : "ln");
        T_CHECK(memcmp(a[0][0], dx0, nx * 4) != 0, "the backward from x16 wrote dx");
        for (int v = 0; v < 2; v++)
            for (int k = 0; k < 3; k++) OPS->free(be, a[v][k]);
        OPS->free(be, x16), OPS->free(be, xw);
    }
    for (int i = 0; i < 3; i++) free(in[i]);
    free(ref);
    free(r);
    free(g);
    float *bufs[] = {x, w, bias, out, mean, rstd, dout, dx, dw, db, dx0, dw0, db0};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) OPS->free(be, bufs[i]);
}
static void test_layernorm(void) { test_norm(0); }
static void test_rmsnorm(void) { test_norm(1); }

/* ---- bias ---- */
static void test_bias(void) {
    int N = 9, OC = 70;
    float *out = dev_rand((size_t)N * OC, -1, 1), *bias = dev_rand(OC, -1, 1);
    float *out0 = dev_copy(out, (size_t)N * OC);
    OPS->bias_add(be, out, bias, N, OC);
    for (int i = 0; i < N * OC; i++)
        T_CHECK(out[i] == out0[i] + bias[i % OC], "bias_add element %d", i);
    float *db = dev_rand(OC, -1, 1), *db0 = dev_copy(db, OC);
    OPS->bias_backward(be, db, out0, N, OC);
    for (int k = 0; k < OC; k++) {
        double s = 0;
        for (int r = 0; r < N; r++) s += out0[r * OC + k];
        T_CLOSE(db[k], (double)db0[k] + s, 1e-6, 1e-6);
    }
    OPS->free(be, out);
    OPS->free(be, bias);
    OPS->free(be, out0);
    OPS->free(be, db);
    OPS->free(be, db0);
}

/* ---- activations ---- */
typedef struct {
    size_t n;
} ew_ctx;

static void gelu_ref(double *out, double **in, const void *vctx) {
    const ew_ctx *c = vctx;
    for (size_t i = 0; i < c->n; i++) {
        double x = in[0][i];
        out[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    }
}

static void swiglu_ref(double *out, double **in, const void *vctx) {
    const ew_ctx *c = vctx;
    for (size_t i = 0; i < c->n; i++) {
        double g = in[0][i];
        out[i] = g / (1.0 + exp(-g)) * in[1][i];
    }
}

static void test_gelu(void) {
    size_t n = 200;
    float *x = dev_rand(n, -6, 6), *out = dev_floats(n);
    x[0] = 0.0f;
    x[1] = -20.0f;
    x[2] = 20.0f;
    OPS->gelu_forward(be, out, x, n);
    ew_ctx ctx = {n};
    double *in[1] = {to_double(x, n)}, *ref = calloc(n, sizeof(double));
    gelu_ref(ref, in, &ctx);
    check_close("gelu_forward", out, ref, n, 1e-6, 1e-5);
    double *r = malloc(sizeof(double) * n), *g = malloc(sizeof(double) * n);
    float *dout = dev_floats(n), *dx = dev_floats(n);
    for (size_t i = 0; i < n; i++) dout[i] = (float)(r[i] = rng_float(-1, 1));
    dx[0] = NAN; /* overwritten, never read */
    OPS->gelu_backward(be, dx, x, dout, n);
    fd_grad(g, gelu_ref, &ctx, in, 0, n, n, r);
    check_grad("gelu dx", dx, NULL, g, n, 1e-4);
    OPS->gelu_backward(be, dout, x, dout, n); /* dx aliasing dout */
    T_CHECK(bits_equal(dout, dx, n * sizeof(float)), "gelu_backward in place differs");
    free(in[0]);
    free(ref);
    free(r);
    free(g);
    OPS->free(be, x);
    OPS->free(be, out);
    OPS->free(be, dout);
    OPS->free(be, dx);
}

static void test_swiglu(void) {
    size_t n = 150;
    float *gate = dev_rand(n, -6, 6), *up = dev_rand(n, -2, 2), *out = dev_floats(n);
    gate[0] = -40.0f;
    gate[1] = 40.0f;
    OPS->swiglu_forward(be, out, gate, up, NULL, NULL, n);
    ew_ctx ctx = {n};
    double *in[2] = {to_double(gate, n), to_double(up, n)}, *ref = calloc(n, sizeof(double));
    swiglu_ref(ref, in, &ctx);
    check_close("swiglu_forward", out, ref, n, 1e-6, 1e-5);
    double *r = malloc(sizeof(double) * n), *g = malloc(sizeof(double) * n);
    float *dout = dev_floats(n), *dg = dev_floats(n), *du = dev_floats(n);
    for (size_t i = 0; i < n; i++) dout[i] = (float)(r[i] = rng_float(-1, 1));
    dg[0] = du[0] = NAN;
    OPS->swiglu_backward(be, dg, du, dout, gate, up, NULL, NULL, n);
    fd_grad(g, swiglu_ref, &ctx, in, 0, n, n, r);
    check_grad("swiglu dgate", dg, NULL, g, n, 1e-4);
    fd_grad(g, swiglu_ref, &ctx, in, 1, n, n, r);
    check_grad("swiglu dup", du, NULL, g, n, 1e-4);
    /* the BF16 saves: the forward writes bf16_pack's bits of gate and up beside the same
     * output; the backward from them (either or both) gives the bits of the backward on their
     * widened values */
    uint16_t *g16 = OPS->malloc(be, n * 2), *u16 = OPS->malloc(be, n * 2);
    uint16_t *gp = OPS->malloc(be, n * 2), *up_p = OPS->malloc(be, n * 2);
    float *out2 = dev_floats(n), *gw = dev_floats(n), *uw = dev_floats(n);
    OPS->swiglu_forward(be, out2, gate, up, g16, u16, n);
    OPS->bf16_pack(be, gp, gate, NULL, 1, (int)n);
    OPS->bf16_pack(be, up_p, up, NULL, 1, (int)n);
    T_CHECK(bits_equal(out2, out, n * sizeof(float)),
            "swiglu_forward with saves: output differs");
    T_CHECK(bits_equal(g16, gp, n * 2) && bits_equal(u16, up_p, n * 2),
            "swiglu_forward's BF16 saves differ from bf16_pack's");
    OPS->bf16_unpack(be, gw, g16, n);
    OPS->bf16_unpack(be, uw, u16, n);
    float *dg_ref = dev_floats(n), *du_ref = dev_floats(n), *dg2 = dev_floats(n),
          *du2 = dev_floats(n);
    OPS->swiglu_backward(be, dg_ref, du_ref, dout, gw, uw, NULL, NULL, n);
    const struct { int g16, u16; } mix[] = {{1, 1}, {1, 0}, {0, 1}};
    for (size_t k = 0; k < sizeof mix / sizeof mix[0]; k++) {
        OPS->swiglu_backward(be, dg2, du2, dout, mix[k].g16 ? NULL : gw, mix[k].u16 ? NULL : uw,
                             mix[k].g16 ? g16 : NULL, mix[k].u16 ? u16 : NULL, n);
        T_CHECK(bits_equal(dg2, dg_ref, n * sizeof(float)) &&
                    bits_equal(du2, du_ref, n * sizeof(float)),
                "swiglu_backward from BF16 saves (gate %d, up %d) differs from the widened "
                "values'",
                mix[k].g16, mix[k].u16);
        /* each gradient alone (swiglu_grad, make_operand's composition of DSWIGLU_*): the
         * same bits */
        OPS->swiglu_grad(be, dg2, FP8T_STEP_DSWIGLU_GATE, dout, mix[k].g16 ? NULL : gw,
                         mix[k].g16 ? g16 : NULL, mix[k].u16 ? NULL : uw, mix[k].u16 ? u16 : NULL,
                         n);
        OPS->swiglu_grad(be, du2, FP8T_STEP_DSWIGLU_UP, dout, mix[k].g16 ? NULL : gw,
                         mix[k].g16 ? g16 : NULL, NULL, NULL, n);
        T_CHECK(bits_equal(dg2, dg_ref, n * sizeof(float)) &&
                    bits_equal(du2, du_ref, n * sizeof(float)),
                "swiglu_grad (gate %d, up %d) differs from swiglu_backward's outputs", mix[k].g16,
                mix[k].u16);
    }
    float *more[] = {out2, gw, uw, dg_ref, du_ref, dg2, du2};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) OPS->free(be, more[i]);
    OPS->free(be, g16), OPS->free(be, u16), OPS->free(be, gp), OPS->free(be, up_p);
    free(in[0]);
    free(in[1]);
    free(ref);
    free(r);
    free(g);
    float *bufs[] = {gate, up, out, dout, dg, du};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) OPS->free(be, bufs[i]);
}

/* ---- attention ---- */
typedef struct {
    int B, T, NH, NKV, HS;
    double theta;
    double l3_factor;
} att_ctx;

/* the RoPE inverse frequency of pair i in double, written out here from the Llama 3.1 recipe
 * (l3_factor > 0: the "llama3" scaling with low/high frequency factors 1 and 4 and an original
 * context of 64 positions, so a small head size meets all three bands) */
static double inv_freq_ref(const att_ctx *c, int i) {
    double f = pow(c->theta, -2.0 * i / c->HS);
    if (c->l3_factor <= 0) return f;
    const double ctx = 64, lo = 1, hi = 4, wl = 2 * M_PI / f;
    if (wl < ctx / hi) return f;                /* high frequencies: kept */
    if (wl > ctx / lo) return f / c->l3_factor; /* low frequencies: stretched */
    double a = (ctx / wl - lo) / (hi - lo);     /* between: a linear blend */
    return (1 - a) * f / c->l3_factor + a * f;
}

/* rope in double: rotate-half pairs (i, i+HS/2), angle t * inv_freq_i */
static void rope_ref(double *v, int t, const att_ctx *c) {
    if (c->theta <= 0) return;
    int half = c->HS / 2;
    for (int i = 0; i < half; i++) {
        double ang = t * inv_freq_ref(c, i), co = cos(ang), s = sin(ang);
        double x1 = v[i], x2 = v[i + half];
        v[i] = x1 * co - x2 * s;
        v[i + half] = x2 * co + x1 * s;
    }
}

static fp8t_attn_shape att_shape(const att_ctx *c) {
    fp8t_attn_shape s = {.B = c->B,
                         .T = c->T,
                         .NH = c->NH,
                         .NKV = c->NKV,
                         .HS = c->HS,
                         .rope_theta = (float)c->theta};
    if (c->l3_factor > 0)
        s.rope_scaling =
            (fp8t_rope_scaling){FP8T_ROPE_LLAMA3, (float)c->l3_factor, 1.0f, 4.0f, 64};
    return s;
}

/* out[B,T,NH*HS] and (when lse != NULL) lse[B,NH,T]; qkv rows [q NH*HS | k NKV*HS | v NKV*HS],
 * query head h reads key/value head h / (NH/NKV) */
static void att_ref_full(double *out, double *lse, const double *qkv, const att_ctx *c) {
    const int HS = c->HS, C = c->NH * HS, CKV = c->NKV * HS, W = C + 2 * CKV;
    double *q = malloc(sizeof(double) * HS), *k = malloc(sizeof(double) * c->T * HS);
    double *p = malloc(sizeof(double) * c->T);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->NH; h++) {
            const int kh = h / (c->NH / c->NKV);
            for (int t = 0; t < c->T; t++) {
                memcpy(k + t * HS, qkv + ((size_t)(b * c->T + t) * W) + C + kh * HS,
                       sizeof(double) * HS);
                rope_ref(k + t * HS, t, c);
            }
            for (int t = 0; t < c->T; t++) {
                memcpy(q, qkv + ((size_t)(b * c->T + t) * W) + h * HS, sizeof(double) * HS);
                rope_ref(q, t, c);
                double mx = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    double s = 0;
                    for (int d = 0; d < HS; d++) s += q[d] * k[j * HS + d];
                    p[j] = s / sqrt((double)HS);
                    mx = fmax(mx, p[j]);
                }
                double sum = 0;
                for (int j = 0; j <= t; j++) sum += exp(p[j] - mx);
                if (lse) lse[(b * c->NH + h) * c->T + t] = mx + log(sum);
                double *o = out + (size_t)(b * c->T + t) * C + h * HS;
                for (int d = 0; d < HS; d++) o[d] = 0;
                for (int j = 0; j <= t; j++) {
                    double pj = exp(p[j] - mx) / sum;
                    const double *v = qkv + ((size_t)(b * c->T + j) * W) + C + CKV + kh * HS;
                    for (int d = 0; d < HS; d++) o[d] += pj * v[d];
                }
            }
        }
    free(q);
    free(k);
    free(p);
}

static void att_ref(double *out, double **in, const void *vctx) {
    att_ref_full(out, NULL, in[0], vctx);
}

static void check_attention_kv(int B, int T, int NH, int NKV, int HS, float theta,
                               float l3_factor) {
    int C = NH * HS, W = (NH + 2 * NKV) * HS;
    size_t nqkv = (size_t)B * T * W, nout = (size_t)B * T * C, nlse = (size_t)B * NH * T;
    float *qkv = dev_rand(nqkv, -1.5f, 1.5f), *out = dev_floats(nout), *lse = dev_floats(nlse);
    att_ctx ctx = {B, T, NH, NKV, HS, theta, l3_factor};
    const fp8t_attn_shape sh = att_shape(&ctx);
    OPS->attention_forward(be, out, lse, NULL, qkv, &sh);
    double *in[1] = {to_double(qkv, nqkv)};
    double *ref = calloc(nout, sizeof(double)), *ref_lse = calloc(nlse, sizeof(double));
    att_ref_full(ref, ref_lse, in[0], &ctx);
    char what[128];
    snprintf(what, sizeof what, "attention_forward B%d T%d NH%d NKV%d HS%d theta %g llama3 %g", B,
             T, NH, NKV, HS, theta, l3_factor);
    check_close(what, out, ref, nout, 1e-5, 1e-4);
    check_close(what, lse, ref_lse, nlse, 1e-5, 1e-5);
    double *r = malloc(sizeof(double) * nout), *g = malloc(sizeof(double) * nqkv);
    float *dout = dev_floats(nout), *dqkv = dev_floats(nqkv);
    for (size_t i = 0; i < nout; i++) dout[i] = (float)(r[i] = rng_float(-1, 1));
    for (size_t i = 0; i < nqkv; i++) dqkv[i] = NAN; /* overwritten completely */
    OPS->attention_backward(be, dqkv, dout, qkv, NULL, out, lse, &sh);
    fd_grad(g, att_ref, &ctx, in, 0, nqkv, nout, r);
    snprintf(what, sizeof what, "attention dqkv B%d T%d NH%d NKV%d HS%d theta %g llama3 %g", B, T,
             NH, NKV, HS, theta, l3_factor);
    check_grad(what, dqkv, NULL, g, nqkv, 1e-4);
    free(in[0]);
    free(ref);
    free(ref_lse);
    free(r);
    free(g);
    OPS->free(be, qkv);
    OPS->free(be, out);
    OPS->free(be, lse);
    OPS->free(be, dout);
    OPS->free(be, dqkv);
}

static void check_attention(int B, int T, int NH, int HS, float theta) {
    check_attention_kv(B, T, NH, NH, HS, theta, 0.0f);
}

/* T = 130 spans three query blocks of the CPU kernel (64 + 64 + 2 rows) */
static void test_attention(void) {
    check_attention(2, 7, 2, 8, 0.0f);
    check_attention(1, 130, 1, 4, 0.0f);
}
static void test_attention_rope(void) {
    check_attention(2, 7, 2, 8, 10000.0f);
    check_attention(1, 130, 1, 6, 100.0f);
}
/* grouped-query attention 2:1 and 3:1, multi-query, with and without RoPE */
static void test_attention_gqa(void) {
    check_attention_kv(2, 7, 4, 2, 8, 0.0f, 0.0f);
    check_attention_kv(1, 9, 6, 2, 4, 10000.0f, 0.0f);
    check_attention_kv(2, 5, 4, 1, 6, 0.0f, 0.0f);
    check_attention_kv(1, 70, 3, 1, 4, 100.0f, 0.0f);
}
/* Llama-3 scaling: theta 10000 (500000) and HS 16 put the pairs' wavelengths (6.3, 20, 63,
 * 200, ...) into all three bands of an original context of 64 (kept below 16, stretched above
 * 64, blended between) */
static void test_attention_llama3_rope(void) {
    check_attention_kv(2, 20, 2, 1, 16, 10000.0f, 8.0f);
    check_attention_kv(1, 9, 4, 2, 16, 500000.0f, 32.0f);
}

/* ---- softmax + cross-entropy ---- */
typedef struct {
    int N, V;
    const int *tgt;
    double dloss;
} xent_ctx;

static void xent_ref(double *out, double **in, const void *vctx) {
    const xent_ctx *c = vctx;
    for (int r = 0; r < c->N; r++) {
        const double *l = in[0] + (size_t)r * c->V;
        if (c->tgt[r] < 0) {
            out[r] = 0;
            continue;
        }
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < c->V; v++) mx = fmax(mx, l[v]);
        for (int v = 0; v < c->V; v++) s += exp(l[v] - mx);
        out[r] = log(s) + mx - l[c->tgt[r]];
    }
}

static void test_softmax_xent(void) {
    int N = 7, V = 33;
    size_t nl = (size_t)N * V;
    float *logits = dev_rand(nl, -5, 5), *losses = dev_floats(N), *dl = dev_floats(nl);
    for (int v = 0; v < V; v++) logits[2 * V + v] += 80.0f; /* large logits: stability */
    int *tgt = OPS->malloc(be, N * sizeof(int));
    for (int r = 0; r < N; r++) tgt[r] = rng_int(V);
    tgt[3] = -1; /* ignored */
    tgt[5] = -100;
    float dloss = 1.0f / 5.0f;
    OPS->softmax_xent(be, losses, dl, logits, tgt, N, V, dloss);
    xent_ctx ctx = {N, V, tgt, dloss};
    double *in[1] = {to_double(logits, nl)}, *ref = calloc(N, sizeof(double));
    xent_ref(ref, in, &ctx);
    check_close("softmax_xent losses", losses, ref, N, 1e-5, 1e-5);
    /* dlogits is the gradient of dloss * sum(losses) */
    double *r = malloc(sizeof(double) * N), *g = malloc(sizeof(double) * nl);
    for (int i = 0; i < N; i++) r[i] = dloss;
    fd_grad(g, xent_ref, &ctx, in, 0, nl, N, r);
    check_grad("softmax_xent dlogits", dl, NULL, g, nl, 1e-4);
    for (int v = 0; v < V; v++)
        T_CHECK(dl[3 * V + v] == 0.0f && dl[5 * V + v] == 0.0f, "ignored row has gradient");
    T_CHECK(losses[3] == 0.0f && losses[5] == 0.0f, "ignored rows have loss");
    /* in place (dlogits aliasing logits) and without dlogits */
    float *l2 = dev_copy(logits, nl), *losses2 = dev_floats(N);
    OPS->softmax_xent(be, losses2, l2, l2, tgt, N, V, dloss);
    T_CHECK(bits_equal(l2, dl, nl * 4) && bits_equal(losses2, losses, N * 4), "in place differs");
    OPS->softmax_xent(be, losses2, NULL, logits, tgt, N, V, dloss);
    T_CHECK(bits_equal(losses2, losses, N * 4), "losses without dlogits differ");
    free(in[0]);
    free(ref);
    free(r);
    free(g);
    OPS->free(be, logits);
    OPS->free(be, losses);
    OPS->free(be, dl);
    OPS->free(be, tgt);
    OPS->free(be, l2);
    OPS->free(be, losses2);
}

/* ---- elementwise, reductions, optimizer ---- */

static void test_elementwise(void) {
    size_t n = 40000;
    float *a = dev_rand(n, -1, 1), *c = dev_rand(n, -1, 1), *out = dev_floats(n);
    OPS->add(be, out, a, c, n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += out[i] != a[i] + c[i];
    T_CHECK(bad == 0, "add: %d wrong", bad);
    float *a0 = dev_copy(a, n);
    OPS->add(be, a, a, c, n); /* aliasing */
    T_CHECK(bits_equal(a, out, n * 4), "add in place differs");
    OPS->accumulate(be, a0, c, n);
    T_CHECK(bits_equal(a0, out, n * 4), "accumulate differs from add");
    /* add_bias without a bias is add, bit for bit; with one, a + (y + bias); the BF16 copy of
     * the sum from the same call is bf16_pack's */
    {
        const int R = 100, C = 400; /* R * C == n */
        float *bias = dev_rand(C, -1, 1), *o2 = dev_floats(n), *o3 = dev_floats(n);
        uint16_t *h = OPS->malloc(be, n * 2), *h2 = OPS->malloc(be, n * 2);
        OPS->add(be, o3, a0, c, n);
        OPS->add_bias(be, o2, h, a0, c, NULL, R, C);
        T_CHECK(bits_equal(o2, o3, n * 4), "add_bias without a bias differs from add");
        OPS->bf16_pack(be, h2, o2, NULL, R, C);
        T_CHECK(!memcmp(h, h2, n * 2), "add_bias's BF16 copy differs from bf16_pack's");
        OPS->add_bias(be, o2, h, a0, c, bias, R, C);
        bad = 0;
        for (int r = 0; r < R; r++)
            for (int k = 0; k < C; k++) {
                const size_t i = (size_t)r * C + k;
                bad += o2[i] != a0[i] + (c[i] + bias[k]);
            }
        T_CHECK(bad == 0, "add_bias: %d wrong", bad);
        OPS->bf16_pack(be, h2, o2, NULL, R, C);
        T_CHECK(!memcmp(h, h2, n * 2), "add_bias's BF16 copy (with a bias) differs");
        OPS->free(be, bias), OPS->free(be, o2), OPS->free(be, o3);
        OPS->free(be, h), OPS->free(be, h2);
    }
    OPS->scale(be, out, -0.37f, n);
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += out[i] != a0[i] * -0.37f;
    T_CHECK(bad == 0, "scale: %d wrong", bad);
    OPS->free(be, a);
    OPS->free(be, c);
    OPS->free(be, out);
    OPS->free(be, a0);
}

static void test_sum_sumsq(void) {
    size_t sizes[] = {1, 1000, 300001};
    for (size_t s = 0; s < 3; s++) {
        size_t n = sizes[s];
        float *x = dev_rand(n, -1, 2), *out = dev_floats(2);
        double want_s = 0, want_q = 0;
        for (size_t i = 0; i < n; i++) {
            want_s += x[i];
            want_q += (double)x[i] * x[i];
        }
        out[0] = 0.5f;
        out[1] = -2.0f;
        OPS->sum(be, &out[0], x, n);
        OPS->sumsq(be, &out[1], x, n);
        T_CLOSE(out[0], 0.5 + want_s, 0, 1e-6);
        T_CLOSE(out[1], -2.0 + want_q, 0, 1e-6);
        OPS->free(be, x);
        OPS->free(be, out);
    }
}

static void test_adamw(void) {
    size_t n = 50001;
    float *p = dev_rand(n, -1, 1), *m = dev_floats(n), *v = dev_floats(n),
          *gr = dev_rand(n, -1, 1);
    float *hp = malloc(n * 4), *hm = calloc(n, 4), *hv = calloc(n, 4);
    memcpy(hp, p, n * 4);
    float lr = 3e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    for (int t = 1; t <= 3; t++) {
        OPS->adamw(be, p, m, v, gr, n, lr, b1, b2, eps, wd, t, gs);
        float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
        for (size_t i = 0; i < n; i++) {
            float g = gr[i] * gs;
            hm[i] = b1 * hm[i] + (1.0f - b1) * g;
            hv[i] = b2 * hv[i] + (1.0f - b2) * g * g;
            float mhat = hm[i] / bc1, vhat = hv[i] / bc2;
            hp[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * hp[i]);
        }
        T_CHECK(bits_equal(p, hp, n * 4) && bits_equal(m, hm, n * 4) && bits_equal(v, hv, n * 4),
                "step %d differs from the hand loop", t);
    }
    /* the formula itself, in double: after one step mhat = g and vhat = g^2, so
     * p1 = p0 - lr * (g / (|g| + eps) + wd * p0) (catches a formula wrong in both loops) */
    float *p1 = dev_rand(4, -1, 1), *m1 = dev_floats(4), *v1 = dev_floats(4),
          *g1 = dev_rand(4, -1, 1);
    float *p1_0 = dev_copy(p1, 4);
    OPS->adamw(be, p1, m1, v1, g1, 4, lr, b1, b2, eps, wd, 1, gs);
    for (int i = 0; i < 4; i++) {
        double g = (double)g1[i] * gs;
        double want = p1_0[i] - lr * (g / (fabs(g) + eps) + wd * p1_0[i]);
        T_CLOSE(p1[i], want, 1e-7, 1e-6);
    }
    float *bufs[] = {p, m, v, gr, p1, m1, v1, g1, p1_0};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) OPS->free(be, bufs[i]);
    free(hp);
    free(hm);
    free(hv);
}

/* ================================ determinism ================================ */

/* Runs the reductions and the attention backward with 1, 2 and 3 threads (and twice each):
 * all results must be bit-identical. Sizes are above every parallel threshold. */
static void test_determinism_threads(void) {
    int N = 512, C = 192, B = 2, T = 70, NH = 3, HS = 16, V = 50;
    size_t nx = (size_t)N * C;
    float *x = dev_rand(nx, -2, 2), *dout = dev_rand(nx, -1, 1), *w = dev_rand(C, 0.5f, 1.5f);
    float *bias = dev_rand(C, -1, 1), *out = dev_floats(nx), *mean = dev_floats(N),
          *rstd = dev_floats(N);
    OPS->layernorm_forward(be, out, mean, rstd, x, w, bias, N, C, 1e-5f);
    int *tok = OPS->malloc(be, (size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) tok[i] = rng_int(V);
    int Ta = T, Ca = NH * HS;
    size_t nqkv = (size_t)B * Ta * 3 * Ca, nout = (size_t)B * Ta * Ca;
    float *qkv = dev_rand(nqkv, -1, 1), *aout = dev_floats(nout),
          *lse = dev_floats((size_t)B * NH * Ta);
    float *adout = dev_rand(nout, -1, 1);
    size_t big = 1000003;
    float *xb = dev_rand(big, -1, 1);

    /* one result blob per thread count: dx|dw|db|dbias|dwte|dwpe|sum|sumsq|attn out|dqkv */
    size_t nres = nx + 3 * C + (size_t)V * C + (size_t)(N / 8) * C + 2 + nout + nqkv + 2 * C;
    float *res[4];
    int threads[4] = {1, 2, 3, 2};
    int saved = omp_get_max_threads();
    for (int k = 0; k < 4; k++) {
        omp_set_num_threads(threads[k]);
        float *r = res[k] = calloc(nres, sizeof(float));
        float *p = r;
        float *dx = p;
        p += nx;
        float *dw = p;
        p += C;
        float *db = p;
        p += C;
        float *dbias = p;
        p += C;
        float *dwte = p;
        p += (size_t)V * C;
        float *dwpe = p;
        p += (size_t)(N / 8) * C;
        float *sums = p;
        p += 2;
        float *ao = p;
        p += nout;
        float *dq = p;
        p += nqkv;
        float *rdx_dw = p;
        p += 2 * C;
        (void)rdx_dw;
        OPS->layernorm_backward(be, dx, dw, db, dout, x, NULL, w, mean, rstd, N, C);
        OPS->rmsnorm_backward(be, dx, rdx_dw, dout, x, NULL, w, rstd, N, C);
        OPS->bias_backward(be, dbias, dout, N, C);
        OPS->embedding_backward(be, dwte, dwpe, dout, tok, 8, N / 8, C);
        OPS->sum(be, &sums[0], xb, big);
        OPS->sumsq(be, &sums[1], xb, big);
        /* multi-query (the group sum of dk, dv over 3 heads) with Llama-3 RoPE; the qkv rows
         * are 5 HS wide then (the buffers are sized for 9 HS) */
        const fp8t_attn_shape sh = {.B = B,
                                    .T = Ta,
                                    .NH = NH,
                                    .NKV = 1,
                                    .HS = HS,
                                    .rope_theta = 10000.0f,
                                    .rope_scaling = {FP8T_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 64}};
        OPS->attention_forward(be, ao, lse, NULL, qkv, &sh);
        OPS->attention_backward(be, dq, adout, qkv, NULL, ao, lse, &sh);
    }
    omp_set_num_threads(saved);
    for (int k = 1; k < 4; k++)
        T_CHECK(bits_equal(res[0], res[k], nres * sizeof(float)),
                "results with %d threads differ from 1 thread", threads[k]);
    for (int k = 0; k < 4; k++) free(res[k]);
    float *bufs[] = {x, dout, w, bias, out, mean, rstd, qkv, aout, lse, adout, xb};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) OPS->free(be, bufs[i]);
    OPS->free(be, tok);
}

/* The same op twice gives the same bits (GEMMs included, at the current thread count). */
static void test_determinism_repeat(void) {
    int M = 70, N = 90, K = 110;
    float *A = dev_rand((size_t)M * K, -1, 1), *B = dev_rand((size_t)N * K, -1, 1);
    float *C1 = dev_floats((size_t)M * N), *C2 = dev_floats((size_t)M * N);
    OPS->gemm_bf16(be, C1, A, B, M, N, K, 0, 1, 0, NULL, NULL);
    OPS->gemm_bf16(be, C2, A, B, M, N, K, 0, 1, 0, NULL, NULL);
    T_CHECK(bits_equal(C1, C2, (size_t)M * N * 4), "gemm_bf16 not repeatable");
    int Bt = 2, T = 65, NH = 2, HS = 32, Cc = NH * HS;
    size_t nq = (size_t)Bt * T * 3 * Cc, no = (size_t)Bt * T * Cc;
    float *qkv = dev_rand(nq, -1, 1), *o1 = dev_floats(no), *o2 = dev_floats(no);
    float *l1 = dev_floats((size_t)Bt * NH * T), *l2 = dev_floats((size_t)Bt * NH * T);
    float *d = dev_rand(no, -1, 1), *g1 = dev_floats(nq), *g2 = dev_floats(nq);
    const fp8t_attn_shape sh = {.B = Bt, .T = T, .NH = NH, .HS = HS};
    OPS->attention_forward(be, o1, l1, NULL, qkv, &sh);
    OPS->attention_forward(be, o2, l2, NULL, qkv, &sh);
    OPS->attention_backward(be, g1, d, qkv, NULL, o1, l1, &sh);
    OPS->attention_backward(be, g2, d, qkv, NULL, o2, l2, &sh);
    T_CHECK(bits_equal(o1, o2, no * 4) && bits_equal(l1, l2, (size_t)Bt * NH * T * 4) &&
                bits_equal(g1, g2, nq * 4),
            "attention not repeatable");
    float *bufs[] = {A, B, C1, C2, qkv, o1, o2, l1, l2, d, g1, g2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) OPS->free(be, bufs[i]);
}

int main(void) {
    t_suite = "cpu_ops";
    char err[256] = "";
    be = fp8t_backend_create("cpu", NULL, err, sizeof err);
    if (!be) {
        printf("FAIL cpu_ops: backend create: %s\n", err);
        return 1;
    }
    T_RUN(test_cpu_expf);
    T_RUN(test_memory);
    T_RUN(test_gemm_f32);
    T_RUN(test_gemm_bf16);
    T_RUN(test_gemm_fp8);
    T_RUN(test_gemm_fp8_composition);
    T_RUN(test_amax);
    T_RUN(test_quantize);
    T_RUN(test_compute_scale);
    T_RUN(test_fake_quantize);
    T_RUN(test_block_fake_quantize);
    T_RUN(test_mxfp8_fake_quantize);
    T_RUN(test_bf16_round);
    T_RUN(test_delayed_update);
    T_RUN(test_embedding);
    T_RUN(test_layernorm);
    T_RUN(test_rmsnorm);
    T_RUN(test_bias);
    T_RUN(test_gelu);
    T_RUN(test_swiglu);
    T_RUN(test_attention);
    T_RUN(test_attention_rope);
    T_RUN(test_attention_gqa);
    T_RUN(test_attention_llama3_rope);
    T_RUN(test_softmax_xent);
    T_RUN(test_elementwise);
    T_RUN(test_sum_sumsq);
    T_RUN(test_adamw);
    T_RUN(test_determinism_threads);
    T_RUN(test_determinism_repeat);
    /* last: they draw from the shared random stream, which the tests above are tuned to */
    T_RUN(test_block_quantize);
    T_RUN(test_gemm_fp8_block);
    fp8t_backend_destroy(be);
    T_MAIN_END();
}
