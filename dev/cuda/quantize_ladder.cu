/* dev/cuda/quantize_ladder.cu — the FP8 quantize op (codes = fp8(x * scale) saturating,
 * optional transposed codes, optional amax), kernel by kernel, llm.c style: every version is
 * checked bit for bit against a CPU reference, then timed on the GPT-2 shapes.
 *
 * Build and run from the repository root (needs only the CUDA runtime, linked statically):
 *
 *   mkdir -p build-quant/dev && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -Xcompiler -Wall,-Wextra -o build-quant/dev/quantize_ladder dev/cuda/quantize_ladder.cu && build-quant/dev/quantize_ladder
 *
 * Optional arguments: `quantize_ladder [iters]` (timed iterations per case, default 20).
 *
 * Versions:
 *   0  plain: the plain backend's (--disable cuda-fusion) path of cuda_quantize (cast kernel,
 *      then a separate byte transpose, through scratch when codes is NULL).
 *   1  the previous fused design, copied here: one 32x32 tile per block of 32x8 threads, one
 *      scalar float load and one byte store per element and output; without codes_t the
 *      grid-stride float4 cast kernel with 16 blocks per SM at most.
 *   2  cuda_quantize as it is now in src/backend/cuda/cuda_quant.cu (#included below, so this
 *      is the shipped code): 64x64 tiles of 256 threads, float4 loads, 4-byte row-major and
 *      16-byte transposed stores, a 4x4 byte transpose in registers, one amax per block as an
 *      unsigned max of |x| bit patterns; the edges a 64x64 tile does not cover go through a
 *      generic 32x32 kernel. Without codes_t: 4 float4 loads in flight per thread.
 *
 * Checks (all must pass before anything is timed): codes, codes_t and amax of each version
 * equal the CPU reference (the toolkit's host __nv_cvt_float_to_fp8, which the project checks
 * against its own fp8_encode on all 2^32 inputs) on shapes with and without tile edges,
 * aligned and misaligned pointers, E4M3 and E5M2, data with huge values, +-Inf, NaN, float
 * subnormals and signed zeros; bytes around each output are guards that must stay untouched,
 * and version 2 must not ask for scratch. On the benchmark shapes version 2 must equal
 * version 1 byte for byte and the CPU reference on a sample.
 *
 * Timing: CUDA events around each launch, L2 flushed (a 256 MiB memset) before each one, so
 * the figures are DRAM-bound like a training step whose input has left L2. GB/s counts 4 bytes
 * read per element plus 1 byte per element for each output written (codes, codes_t). */
#include "backend/cuda/cuda_quant.cu"

#include <math.h>
#include <string.h>
#include <vector>

/* ---- the scratch buffers cuda_quant.cu asks for (cuda_backend.cu is not linked in) ---- */
static int n_scratch_calls;
void *cuda_scratch(fp8t_backend *b, int slot, size_t bytes) {
    cuda_state *s = cuda_of(b);
    n_scratch_calls++;
    if (s->scratch_bytes[slot] < bytes) {
        CUDA_CHECK(cudaStreamSynchronize(s->stream));
        if (s->scratch[slot]) CUDA_CHECK(cudaFree(s->scratch[slot]));
        CUDA_CHECK(cudaMalloc(&s->scratch[slot], bytes));
        s->scratch_bytes[slot] = bytes;
    }
    return s->scratch[slot];
}

/* quantize_colsum's column sums live in cuda_norm.cu and the GELU backward in cuda_misc.cu,
 * which are not linked in: the ladder never calls quantize_colsum or
 * gelu_backward_quantize_colsum, so these only satisfy the linker */
void cuda_column_sums(fp8t_backend *, float *, const float *, int, int) {
    fprintf(stderr, "quantize_ladder: cuda_column_sums is not part of the ladder\n");
    exit(1);
}
void cuda_column_sums_finish(fp8t_backend *, float *, const float *, int, int) {
    fprintf(stderr, "quantize_ladder: cuda_column_sums_finish is not part of the ladder\n");
    exit(1);
}
void cuda_gelu_backward(fp8t_backend *, float *, const float *, const float *, size_t) {
    fprintf(stderr, "quantize_ladder: cuda_gelu_backward is not part of the ladder\n");
    exit(1);
}
void cuda_gelu_backward_bias(fp8t_backend *, float *, const float *, const float *, const float *,
                             int, int) {
    fprintf(stderr, "quantize_ladder: cuda_gelu_backward_bias is not part of the ladder\n");
    exit(1);
}
/* nor the BF16 copies of GELU's input (cuda_bf16_operand.cu) */
void cuda_bf16_pack(fp8t_backend *, uint16_t *, const float *, const float *, int, int) {
    fprintf(stderr, "quantize_ladder: cuda_bf16_pack is not part of the ladder\n");
    exit(1);
}
const float *cuda_bf16_widen(fp8t_backend *, int, const float *x, const uint16_t *x16, size_t) {
    if (!x16) return x;
    fprintf(stderr, "quantize_ladder: cuda_bf16_widen is not part of the ladder\n");
    exit(1);
}

/* ---- version 1: the previous fused kernel, verbatim but for the name ---- */
#define V1_TILE 32
#define V1_ROWS 8
__global__ void v1_cast_transpose_fp8_kernel(uint8_t *codes, uint8_t *codes_t, float *amax_out,
                                             const float *__restrict__ x, int rows, int cols,
                                             fp8_format fmt, const float *scale_p) {
    __shared__ uint8_t tile[V1_TILE][V1_TILE + 4];
    float scale = *scale_p;
    int c0 = blockIdx.x * V1_TILE, r0 = blockIdx.y * V1_TILE;
    int tx = threadIdx.x, ty = threadIdx.y;
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < V1_TILE / V1_ROWS; i++) {
        int r = r0 + ty + i * V1_ROWS, c = c0 + tx;
        if (r < rows && c < cols) {
            float v = x[(size_t)r * cols + c];
            acc = amax_merge_dev(acc, v);
            uint8_t code = fp8_enc_dev(v * scale, fmt);
            if (codes) codes[(size_t)r * cols + c] = code;
            tile[ty + i * V1_ROWS][tx] = code;
        }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < V1_TILE / V1_ROWS; i++) {
        int c = c0 + ty + i * V1_ROWS, r = r0 + tx;
        if (r < rows && c < cols) codes_t[(size_t)c * rows + r] = tile[tx][ty + i * V1_ROWS];
    }
    if (amax_out) {
        __shared__ float sh[V1_TILE * V1_ROWS / 32];
        int lin = ty * V1_TILE + tx;
        acc = warp_amax(acc);
        if ((lin & 31) == 0) sh[lin >> 5] = acc;
        __syncthreads();
        if (lin == 0) {
            float a = sh[0];
            for (int w = 1; w < V1_TILE * V1_ROWS / 32; w++) a = amax_merge_dev(a, sh[w]);
            atomic_amax_merge(amax_out, a);
        }
    }
}

/* the previous non-plain dispatch of cuda_quantize */
static void quantize_v1(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                        const float *x, int rows, int cols, fp8_format fmt, const float *scale) {
    if (rows <= 0 || cols <= 0) return;
    cuda_state *s = cuda_of(b);
    size_t n = (size_t)rows * cols;
    if (!codes_t) {
        int vec = aligned16(x) && (!codes || aligned16(codes)) ? 1 : 0;
        cast_fp8_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(codes, amax_out, x, n,
                                                                          fmt, scale, vec);
        CUDA_LAUNCH_CHECK(s);
        return;
    }
    dim3 grid(cdiv_u(cols, V1_TILE), cdiv_u(rows, V1_TILE)), block(V1_TILE, V1_ROWS);
    v1_cast_transpose_fp8_kernel<<<grid, block, 0, s->stream>>>(codes, codes_t, amax_out, x, rows,
                                                                cols, fmt, scale);
    CUDA_LAUNCH_CHECK(s);
}

/* ---- the ladder ---- */
static cuda_state g_state;
static fp8t_backend g_be;

static void run_version(int version, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                        const float *x, int rows, int cols, fp8_format fmt, const float *scale) {
    g_state.plain = version == 0;
    if (version == 1)
        quantize_v1(&g_be, codes, codes_t, amax_out, x, rows, cols, fmt, scale);
    else
        cuda_quantize(&g_be, codes, codes_t, amax_out, x, rows, cols, fmt, scale);
}

/* ---- CPU reference ---- */
static uint8_t ref_enc(float v, fp8_format fmt) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE,
                                          fmt == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
}

/* max(amax0, amax(x)) with NaN winning, as the op contract says */
static float ref_amax(float amax0, const float *x, size_t n) {
    float a = amax0;
    for (size_t i = 0; i < n && !isnan(a); i++) {
        if (isnan(x[i]))
            a = NAN;
        else if (fabsf(x[i]) > a)
            a = fabsf(x[i]);
    }
    return a;
}

static int same_amax(float got, float want) {
    if (isnan(want)) return isnan(got);
    uint32_t g, w;
    memcpy(&g, &got, 4), memcpy(&w, &want, 4);
    return g == w;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float rnd_unit(void) { return (rnd_u32() >> 8) * (1.0f / 16777216.0f); }
static float rnd_normal(void) {
    float u1 = rnd_unit() + 1e-7f, u2 = rnd_unit();
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

/* kind 0: normal data with outliers and underflows; 1: plus +-Inf, float subnormals, signed
 * zeros, huge finite values; 2: kind 1 plus a few NaN (positive, negative, with payloads) */
static void fill_data(float *x, size_t n, int kind) {
    for (size_t i = 0; i < n; i++) {
        float v = rnd_normal();
        int r = (int)(rnd_u32() % 100);
        if (r == 0)
            v *= 1000.0f;
        else if (r == 1)
            v *= 1e-6f;
        else if (kind >= 1 && r == 2)
            v = (rnd_u32() & 1) ? INFINITY : -INFINITY;
        else if (kind >= 1 && r == 3)
            v *= 1e-40f;
        else if (kind >= 1 && r == 4)
            v = (rnd_u32() & 1) ? 0.0f : -0.0f;
        else if (kind >= 1 && r == 5)
            v = (rnd_u32() & 1) ? 3.0e38f : -3.4028235e38f;
        x[i] = v;
    }
    if (kind == 2 && n > 0) {
        static const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffbfffffu};
        for (int k = 0; k < 4; k++) {
            float v;
            memcpy(&v, &nans[k], 4);
            x[rnd_u32() % n] = v;
        }
    }
}

#define GUARD 64 /* bytes of 0xA5 before and after each output */

static int n_pass, n_fail;

/* One check case: every version on (rows, cols, fmt, which outputs, data kind, pointer
 * offsets), compared with the CPU reference. */
static void check_case(int rows, int cols, fp8_format fmt, int want_codes, int want_t,
                       int want_amax, int kind, int x_off, int c_off, int t_off) {
    size_t n = (size_t)rows * cols;
    std::vector<float> x(n + 4);
    fill_data(x.data() + x_off, n, kind);
    const float *xh = x.data() + x_off;
    float scale = (0.5f + rnd_unit()) * (fmt == FP8_E4M3 ? 448.0f : 57344.0f) / 4.0f;
    float amax0 = 0.25f;
    std::vector<uint8_t> ref(n), ref_t(n);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            uint8_t code = ref_enc(xh[(size_t)r * cols + c] * scale, fmt);
            ref[(size_t)r * cols + c] = code;
            ref_t[(size_t)c * rows + r] = code;
        }
    float ref_a = ref_amax(amax0, xh, n);

    float *dx, *dscale, *damax;
    uint8_t *dc, *dct;
    size_t obytes = n + 2 * GUARD + 16;
    CUDA_CHECK(cudaMalloc(&dx, (n + 4) * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&dc, obytes));
    CUDA_CHECK(cudaMalloc(&dct, obytes));
    CUDA_CHECK(cudaMalloc(&dscale, 4));
    CUDA_CHECK(cudaMalloc(&damax, 4));
    CUDA_CHECK(cudaMemcpy(dx, x.data(), (n + 4) * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dscale, &scale, 4, cudaMemcpyHostToDevice));
    std::vector<uint8_t> got(obytes), got_t(obytes);
    for (int version = 0; version <= 2; version++) {
        CUDA_CHECK(cudaMemset(dc, 0xA5, obytes));
        CUDA_CHECK(cudaMemset(dct, 0xA5, obytes));
        CUDA_CHECK(cudaMemcpy(damax, &amax0, 4, cudaMemcpyHostToDevice));
        int scratch_before = n_scratch_calls;
        uint8_t *codes = want_codes ? dc + GUARD + c_off : NULL;
        uint8_t *codes_t = want_t ? dct + GUARD + t_off : NULL;
        run_version(version, codes, codes_t, want_amax ? damax : NULL, dx + x_off, rows, cols,
                    fmt, dscale);
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(got.data(), dc, obytes, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(got_t.data(), dct, obytes, cudaMemcpyDeviceToHost));
        float a;
        CUDA_CHECK(cudaMemcpy(&a, damax, 4, cudaMemcpyDeviceToHost));
        char what[256] = "";
        /* codes: the reference inside, guards (and everything, when not asked for) untouched */
        for (size_t i = 0; i < obytes && !what[0]; i++) {
            int inside = want_codes && i >= (size_t)(GUARD + c_off) && i < GUARD + c_off + n;
            uint8_t want = inside ? ref[i - GUARD - c_off] : 0xA5;
            if (got[i] != want)
                snprintf(what, sizeof(what), "codes byte %zd: got 0x%02x want 0x%02x",
                         (ptrdiff_t)i - GUARD - c_off, got[i], want);
        }
        for (size_t i = 0; i < obytes && !what[0]; i++) {
            int inside = want_t && i >= (size_t)(GUARD + t_off) && i < GUARD + t_off + n;
            uint8_t want = inside ? ref_t[i - GUARD - t_off] : 0xA5;
            if (got_t[i] != want)
                snprintf(what, sizeof(what), "codes_t byte %zd: got 0x%02x want 0x%02x",
                         (ptrdiff_t)i - GUARD - t_off, got_t[i], want);
        }
        if (!what[0] && want_amax && !same_amax(a, ref_a))
            snprintf(what, sizeof(what), "amax %.9g want %.9g", a, ref_a);
        if (!what[0] && !want_amax && a != amax0)
            snprintf(what, sizeof(what), "amax written though not asked for");
        if (!what[0] && version == 2 && n_scratch_calls != scratch_before)
            snprintf(what, sizeof(what), "asked for scratch");
        int ok = !what[0];
        ok ? n_pass++ : n_fail++;
        if (!ok || getenv("LADDER_VERBOSE"))
            printf("%s  v%d %5dx%-5d %s codes=%d codes_t=%d amax=%d data=%d off=%d/%d/%d %s\n",
                   ok ? "PASS" : "FAIL", version, rows, cols, fmt == FP8_E4M3 ? "e4m3" : "e5m2",
                   want_codes, want_t, want_amax, kind, x_off, c_off, t_off, what);
    }
    cudaFree(dx), cudaFree(dc), cudaFree(dct), cudaFree(dscale), cudaFree(damax);
}

static void run_checks(void) {
    static const int shapes[][2] = {{1, 1},       {3, 7},     {16, 4},     {64, 64},   {128, 768},
                                    {64, 68},     {144, 200}, {208, 1600}, {100, 130}, {130, 64},
                                    {1000, 1001}, {80, 5},    {192, 324},  {64, 4800}, {320, 132},
                                    {16, 256},    {2048, 96}, {48, 4}};
    /* which outputs: codes, codes_t, amax */
    static const int modes[][3] = {{1, 1, 1}, {1, 0, 1}, {0, 1, 1}, {0, 0, 1},
                                   {1, 1, 0}, {0, 1, 0}, {1, 0, 0}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
        for (int fi = 0; fi < 2; fi++)
            for (size_t mi = 0; mi < sizeof(modes) / sizeof(modes[0]); mi++) {
                int kind = (int)((si + mi + fi) % 3);
                check_case(shapes[si][0], shapes[si][1], fi ? FP8_E5M2 : FP8_E4M3, modes[mi][0],
                           modes[mi][1], modes[mi][2], kind, 0, 0, 0);
            }
    /* misaligned x, codes, codes_t: the fallbacks */
    static const int offs[][3] = {{1, 0, 0}, {0, 1, 0}, {0, 4, 0},
                                  {0, 0, 4}, {0, 2, 8}, {2, 3, 1}};
    for (size_t oi = 0; oi < sizeof(offs) / sizeof(offs[0]); oi++)
        for (int with_t = 0; with_t < 2; with_t++)
            check_case(192, 200, FP8_E4M3, 1, with_t, 1, 2, offs[oi][0], offs[oi][1],
                       offs[oi][2]);
    printf("checks: %d passed, %d failed\n", n_pass, n_fail);
}

/* The shared-memory layout of cast_transpose_fp8_tiled_kernel, on the host with the kernel's
 * index formulas: every word written exactly once, each 16-byte read returning rows
 * 16k .. 16k+15 of its column in order, and the bank conflicts of the writes (per warp and
 * store instruction) and of the 16-byte reads (per quarter warp). */
static void check_tile_layout(void) {
    int owner[QT2_C * QT2_R / 4]; /* word -> (micro-row, column) it holds, or -1 */
    for (int w = 0; w < QT2_C * QT2_R / 4; w++) owner[w] = -1;
    int ok = 1, worst_write = 0, worst_read = 0;
    for (int warp = 0; warp < QT2_THREADS / 32; warp++)
        for (int t = 0; t < 4; t++) {
            int per_bank[32] = {0};
            for (int lane = 0; lane < 32; lane++) {
                int tid = warp * 32 + lane, mc = tid & 15, mr = tid >> 4;
                int g = mr >> 2, q = mr & 3, j = (t + mc) & 3, c = 4 * mc + j;
                int w = c * 16 + 4 * (g ^ ((c >> 3) & 3)) + q;
                if (owner[w] != -1) ok = 0;
                owner[w] = mr * QT2_C + c; /* the word holds rows 4mr..4mr+3 of column c */
                per_bank[w % 32]++;        /* distinct words: every lane writes its own */
            }
            for (int bnk = 0; bnk < 32; bnk++)
                worst_write = per_bank[bnk] > worst_write ? per_bank[bnk] : worst_write;
        }
    for (int w = 0; w < QT2_C * QT2_R / 4; w++) ok = ok && owner[w] != -1;
    for (int tid0 = 0; tid0 < QT2_THREADS; tid0 += 8) { /* one quarter warp of 16-byte reads */
        int per_bank[32] = {0};
        for (int tid = tid0; tid < tid0 + 8; tid++) {
            int c = tid >> 2, k = tid & 3, slot = c * 4 + (k ^ ((c >> 3) & 3));
            for (int q = 0; q < 4; q++) {
                int w = slot * 4 + q;
                ok = ok && owner[w] == (4 * k + q) * QT2_C + c; /* rows 16k+4q .. +3 */
                per_bank[w % 32]++;
            }
        }
        for (int bnk = 0; bnk < 32; bnk++)
            worst_read = per_bank[bnk] > worst_read ? per_bank[bnk] : worst_read;
    }
    ok = ok && worst_write <= 2 && worst_read <= 1;
    ok ? n_pass++ : n_fail++;
    printf("%s  64x64 tile layout: words written once and read in row order; bank conflicts "
           "%d-way on writes, %d-way on reads\n",
           ok ? "PASS" : "FAIL", worst_write, worst_read);
}

/* ---- timing ---- */
static void bench(int iters) {
    static const int shapes[][2] = {{32768, 768}, {32768, 3072}, {8192, 1600}, {8192, 6400}};
    static const struct {
        int codes, codes_t;
        const char *name;
    } modes[] = {
        {1, 1, "codes+codes_t+amax"}, {1, 0, "codes+amax"}, {0, 1, "codes_t+amax (codes NULL)"}};
    size_t max_n = (size_t)32768 * 3072;
    float *dx, *dscale, *damax;
    uint8_t *dc, *dct, *dc1, *dct1, *flush;
    const size_t flush_bytes = (size_t)256 << 20;
    CUDA_CHECK(cudaMalloc(&dx, max_n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&dc, max_n));
    CUDA_CHECK(cudaMalloc(&dct, max_n));
    CUDA_CHECK(cudaMalloc(&dc1, max_n));
    CUDA_CHECK(cudaMalloc(&dct1, max_n));
    CUDA_CHECK(cudaMalloc(&dscale, 4));
    CUDA_CHECK(cudaMalloc(&damax, 4));
    CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
    std::vector<float> xh(max_n);
    fill_data(xh.data(), max_n, 1);
    CUDA_CHECK(cudaMemcpy(dx, xh.data(), max_n * sizeof(float), cudaMemcpyHostToDevice));
    const float scale = 448.0f / 4.0f;
    CUDA_CHECK(cudaMemcpy(dscale, &scale, 4, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    std::vector<uint8_t> h1(max_n), h2(max_n);

    printf("\n%-13s %-27s %-3s %10s %9s %8s\n", "shape", "outputs", "ver", "time_us", "GB/s",
           "vs v1");
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int rows = shapes[si][0], cols = shapes[si][1];
        size_t n = (size_t)rows * cols;
        /* version 2 against version 1 (byte for byte) and the CPU reference (a sample) */
        {
            float z = 0.0f, a1, a2;
            CUDA_CHECK(cudaMemcpy(damax, &z, 4, cudaMemcpyHostToDevice));
            run_version(1, dc1, dct1, damax, dx, rows, cols, FP8_E4M3, dscale);
            CUDA_CHECK(cudaMemcpy(&a1, damax, 4, cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaMemcpy(damax, &z, 4, cudaMemcpyHostToDevice));
            run_version(2, dc, dct, damax, dx, rows, cols, FP8_E4M3, dscale);
            CUDA_CHECK(cudaMemcpy(&a2, damax, 4, cudaMemcpyDeviceToHost));
            int ok = same_amax(a2, a1) && same_amax(a2, ref_amax(0.0f, xh.data(), n));
            CUDA_CHECK(cudaMemcpy(h1.data(), dc1, n, cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaMemcpy(h2.data(), dc, n, cudaMemcpyDeviceToHost));
            ok = ok && memcmp(h1.data(), h2.data(), n) == 0;
            for (size_t i = 0; i < n && ok; i += 997)
                ok = h2[i] == ref_enc(xh[i] * scale, FP8_E4M3);
            CUDA_CHECK(cudaMemcpy(h1.data(), dct1, n, cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaMemcpy(h2.data(), dct, n, cudaMemcpyDeviceToHost));
            ok = ok && memcmp(h1.data(), h2.data(), n) == 0;
            for (size_t i = 0; i < n && ok; i += 991) {
                size_t c = i / rows, r = i % rows;
                ok = h2[i] == ref_enc(xh[r * cols + c] * scale, FP8_E4M3);
            }
            ok ? n_pass++ : n_fail++;
            printf("%s  %dx%d e4m3: v2 == v1 (codes, codes_t, amax) and == CPU on a sample\n",
                   ok ? "PASS" : "FAIL", rows, cols);
        }
        for (size_t mi = 0; mi < sizeof(modes) / sizeof(modes[0]); mi++) {
            double us_v1 = 0.0;
            for (int version = 0; version <= 2; version++) {
                uint8_t *codes = modes[mi].codes ? dc : NULL;
                uint8_t *codes_t = modes[mi].codes_t ? dct : NULL;
                double total_ms = 0.0;
                for (int it = -2; it < iters; it++) { /* 2 warm-up launches */
                    CUDA_CHECK(cudaMemsetAsync(flush, it & 0xff, flush_bytes, g_state.stream));
                    CUDA_CHECK(cudaEventRecord(e0, g_state.stream));
                    run_version(version, codes, codes_t, damax, dx, rows, cols, FP8_E4M3, dscale);
                    CUDA_CHECK(cudaEventRecord(e1, g_state.stream));
                    CUDA_CHECK(cudaEventSynchronize(e1));
                    float ms;
                    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                    if (it >= 0) total_ms += ms;
                }
                double us = total_ms * 1000.0 / iters;
                double bytes = (double)n * (4 + modes[mi].codes + modes[mi].codes_t);
                if (version == 1) us_v1 = us;
                char shape[32], rel[16] = "";
                snprintf(shape, sizeof(shape), "%dx%d", rows, cols);
                if (version == 2) snprintf(rel, sizeof(rel), "%.2fx", us_v1 / us);
                printf("%-13s %-27s v%-2d %10.1f %9.1f %8s\n", shape, modes[mi].name, version, us,
                       bytes / (us * 1e3), rel);
            }
        }
    }
    cudaFree(dx), cudaFree(dc), cudaFree(dct), cudaFree(dc1), cudaFree(dct1);
    cudaFree(dscale), cudaFree(damax), cudaFree(flush);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 20;
    if (iters < 1) {
        fprintf(stderr, "usage: %s [iters >= 1]\n", argv[0]);
        return 2;
    }
    check_tile_layout(); /* host only */
    int dev = 0;
    CUDA_CHECK(cudaSetDevice(dev));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    g_state.device = dev;
    g_state.num_sms = prop.multiProcessorCount;
    CUDA_CHECK(cudaStreamCreate(&g_state.stream));
    g_be.name = "cuda";
    g_be.impl = &g_state;

    run_checks();
    if (n_fail) {
        printf("checks failed: not timing\n");
        return 1;
    }
    bench(iters);
    printf("\n%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
