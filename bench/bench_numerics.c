/* fp8train — throughput of the FP8 numerics on this CPU, one thread and all threads.
 *   encode            fp8_encode called per element (the scalar API)
 *   quantize          fp8_quantize float32 -> E4M3, scaled, saturating (bulk)
 *   quantize+amax     fp8_quantize_amax, the fused pass training uses
 *   dequantize        fp8_dequantize E4M3 -> float32 (table)
 *   fake_quantize     fp8_fake_quantize E4M3 (quantize-dequantize)
 *   bf16_round, amax
 * Usage: bench_numerics [n_elements] (default: 64K, in cache, then 4M, from memory). Prints
 * elements/s (best of several runs) and, last, the one-thread quantize+amax rate against the
 * 0.5e9 elements/s target. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "fp8train/fp8.h"

typedef enum {
    B_ENCODE,
    B_QUANT,
    B_QUANT_AMAX,
    B_DEQUANT,
    B_FAKE,
    B_BF16,
    B_AMAX,
    B_COUNT
} bench_kind;
static const char *NAMES[B_COUNT] = {
    "encode (scalar)", "quantize",   "quantize+amax", "dequantize",
    "fake_quantize",   "bf16_round", "amax"};

static volatile float sink; /* keeps results alive */

static void run_once(bench_kind k, float *y, uint8_t *q, const float *x, size_t n) {
    switch (k) {
    case B_ENCODE: {
        /* the scalar API in a plain loop (threaded like the bulk calls for the "all" column) */
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) q[i] = fp8_encode(x[i] * 0.5f, FP8_E4M3, 1);
        break;
    }
    case B_QUANT: fp8_quantize(q, x, n, 0.5f, FP8_E4M3, 1); break;
    case B_QUANT_AMAX: sink = fp8_quantize_amax(q, x, n, 0.5f, FP8_E4M3, 1); break;
    case B_DEQUANT: fp8_dequantize(y, q, n, 2.0f, FP8_E4M3); break;
    case B_FAKE: fp8_fake_quantize(y, x, n, 0.5f, FP8_E4M3); break;
    case B_BF16: bf16_round(y, x, n); break;
    case B_AMAX: sink = fp8_amax(x, n); break;
    default: break;
    }
}

static double thread_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best of several runs. One thread is timed in this thread's CPU time, so that other jobs on a
 * shared machine do not count against it; all threads are timed on the wall clock. */
static double rate(bench_kind k, float *y, uint8_t *q, const float *x, size_t n, int one_thread) {
    run_once(k, y, q, x, n); /* warm up: page faults, caches, thread pool */
    double best = 1e30;
    for (int rep = 0; rep < 9; rep++) {
        const double t0 = one_thread ? thread_cpu_seconds() : omp_get_wtime();
        run_once(k, y, q, x, n);
        const double dt = (one_thread ? thread_cpu_seconds() : omp_get_wtime()) - t0;
        if (dt > 0 && dt < best) best = dt;
    }
    return (double)n / best;
}

/* Runs every op on n elements; returns the one-thread quantize+amax rate (0 on error). */
static double bench_size(size_t n) {
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y); /* [n] */
    uint8_t *q = malloc(n);                                       /* [n] */
    if (!x || !y || !q) {
        fprintf(stderr, "bench_numerics: cannot allocate %zu elements\n", n);
        free(x), free(y), free(q);
        return 0;
    }
    uint64_t s = 12345;
    for (size_t i = 0; i < n; i++) { /* roughly N(0, 1)-sized values over many binades */
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = ldexpf((float)(s & 0xFFFFF) / 1048576.0f + 1.0f, (int)((s >> 20) % 24) - 16) *
               ((s >> 63) ? -1.0f : 1.0f);
    }
    fp8_quantize(q, x, n, 0.5f, FP8_E4M3, 1);

    const int nthreads = omp_get_max_threads();
    printf("bench_numerics: n = %zu elements (float32 -> E4M3 unless said), %d threads\n", n,
           nthreads);
    printf("%-18s %16s %16s\n", "op", "1 thread (el/s)", "all (wall)");
    double quant_amax_1 = 0;
    for (int k = 0; k < B_COUNT; k++) {
        omp_set_num_threads(1);
        const double r1 = rate((bench_kind)k, y, q, x, n, 1);
        omp_set_num_threads(nthreads);
        const double rn = rate((bench_kind)k, y, q, x, n, 0);
        printf("%-18s %16.3e %16.3e\n", NAMES[k], r1, rn);
        if (k == B_QUANT_AMAX) quant_amax_1 = r1;
    }
    free(x), free(y), free(q);
    return quant_amax_1;
}

int main(int argc, char **argv) {
    /* default: 64K elements (in cache: compute bound) and 4M (from memory) */
    size_t sizes[2] = {(size_t)1 << 16, (size_t)1 << 22};
    int nsizes = 2;
    if (argc > 1) {
        char *end;
        const long long v = strtoll(argv[1], &end, 10);
        if (*end || v <= 0) {
            fprintf(stderr, "bench_numerics: bad element count '%s' (want a positive integer)\n",
                    argv[1]);
            return 2;
        }
        sizes[0] = (size_t)v, nsizes = 1;
    }
    double worst = 1e30;
    for (int k = 0; k < nsizes; k++) {
        const double r = bench_size(sizes[k]);
        if (r <= 0) return 1;
        if (r < worst) worst = r;
    }
    printf("quantize+amax per core, slowest size: %.2e el/s (target >= 5.0e+08): %s\n", worst,
           worst >= 5e8 ? "ok" : "BELOW TARGET");
    return 0;
}
