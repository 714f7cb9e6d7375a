/* dev/cuda/quantize_ladder.cu — the FP8 quantize op (codes = fp8(x * scale) saturating,
 * optional transposed codes, optional amax), kernel by kernel, llm.c style: every version is
 * checked bit for bit against a CPU reference, then timed on the GPT-2 shapes.
 *
 * Build and run from the repository root (needs only the CUDA runtime, linked statically):
 *
 *   mkdir -p build-quant/dev && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -Xcompiler -Wall,-Wextra -o build-quant/dev/quantize_ladder dev/cuda/quantize_ladder.cu && build-quant/dev/quantize_ladder
 *
 * (or `make build-gpu/dev/cuda/quantize_ladder BUILD=build-gpu`). Optional arguments:
 * `quantize_ladder [iters] [all|per-tensor|scaled]` (timed iterations per case, default 20;
 * which op, default both).
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
 * read per element plus 1 byte per element for each output written (codes, codes_t).
 *
 * The block- and row-scaled quantize (cuda_quantize_scaled, the make_operand of `block` and
 * `rowwise`), both orientations from one read:
 *   s1  the first kernels, copied here: 256 threads per 128x128 tile, 16 rows per thread.
 *   s2  cuda_quantize_scaled as shipped: 512 threads per tile, 8 rows per thread, 64
 *       registers (see cuda_quant.cu).
 * Checks: s2 equals s1 byte for byte in every output (codes, codes_t, both scale_inv arrays,
 * amax, column sums, GELU's BF16 save) for VEC128 / BLK128 / ROW, every prologue (none, GELU
 * with and without bias and its save, the GELU backward from a BF16 or an FP32 input with
 * bias), with and without column sums, E4M3 and E5M2, power-of-two scales or not, on shapes
 * with partial tiles and NaN / Inf data (s1 is checked against the CPU by gpu_test). Timed on
 * the GPT-2 1.5B and Llama 1B shapes; GB/s there counts every byte read and written (ROW's
 * amax pass reads x a second time). */
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
/* the scaled versions' column sums: colsum[c] += the tiles' partials in tile order (one order
 * for every version, so the versions' sums compare bit for bit) */
__global__ void ladder_colsum_finish_kernel(float *colsum, const float *part, int nchunks,
                                            int cols) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float t = part[c];
    for (int i = 1; i < nchunks; i++) t += part[(size_t)i * cols + c];
    colsum[c] += t;
}
void cuda_column_sums_finish(fp8t_backend *b, float *colsum, const float *part, int nchunks,
                             int cols) {
    ladder_colsum_finish_kernel<<<cdiv_u((size_t)cols, 256), 256, 0, cuda_of(b)->stream>>>(
        colsum, part, nchunks, cols);
    CUDA_LAUNCH_CHECK(cuda_of(b));
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
/* nor SwiGLU's unfused ops (the scaled kernels' plain path) */
void cuda_swiglu_forward(fp8t_backend *, float *, const float *, const float *, uint16_t *,
                         uint16_t *, size_t) {
    fprintf(stderr, "quantize_ladder: cuda_swiglu_forward is not part of the ladder\n");
    exit(1);
}
void cuda_swiglu_grad(fp8t_backend *, float *, int, const float *, const float *,
                      const uint16_t *, const float *, const uint16_t *, size_t) {
    fprintf(stderr, "quantize_ladder: cuda_swiglu_grad is not part of the ladder\n");
    exit(1);
}
const float *cuda_swiglu_values(fp8t_backend *, const fp8t_operand_req *) {
    fprintf(stderr, "quantize_ladder: cuda_swiglu_values is not part of the ladder\n");
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

/* ---- scaled version 1: the first quantize_scaled kernels, verbatim but for the names ----
 * 256 threads per 128x128 tile, 16 rows per thread: the VEC kernels need ~120 registers, so
 * an SM holds 2 blocks (16 warps) whose load, reductions and stores run one after the other;
 * with GELU or its backward in the prologue that left them compute-bound (1.2-1.5 TB/s on an
 * H100). */
#define S1_THREADS 256

/* the tile's float4s after the prologue: v[k] = columns 4tx.. of tile row 16ty + k (zeros
 * outside x) */
template <int PRO>
__device__ __forceinline__ void s1_load(float4 v[16], const sq_args &a, int r0, int c0, int tx,
                                        int ty) {
    const int c = c0 + 4 * tx;
    const bool col_ok = c < a.cols;
    float4 bb = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (PRO != SQ_PLAIN && a.bias && col_ok) bb = *(const float4 *)(a.bias + c);
#pragma unroll
    for (int k = 0; k < 16; k++) {
        const int r = r0 + 16 * ty + k;
        float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (col_ok && r < a.rows) {
            const size_t e0 = (size_t)r * a.cols + c;
            t = *(const float4 *)(a.x + e0);
            if (PRO == SQ_GELU) {
                if (a.bias) t = make_float4(t.x + bb.x, t.y + bb.y, t.z + bb.z, t.w + bb.w);
                if (a.save16) *(uint2 *)(a.save16 + e0) = bf16x4_of(t);
                t = make_float4(gelu_dev(t.x), gelu_dev(t.y), gelu_dev(t.z), gelu_dev(t.w));
            } else if (PRO == SQ_DGELU) {
                float4 u = a.gx16 ? f32x4_of_bf16(*(const uint2 *)(a.gx16 + e0))
                                  : *(const float4 *)(a.gx + e0);
                if (a.bias) u = make_float4(u.x + bb.x, u.y + bb.y, u.z + bb.z, u.w + bb.w);
                t = make_float4(gelu_grad(u.x, t.x), gelu_grad(u.y, t.y), gelu_grad(u.z, t.z),
                                gelu_grad(u.w, t.w));
            }
        }
        v[k] = t;
    }
}

/* ROW's first pass: the amax of every row and column of the values, as |x| bit patterns
 * max-merged into row_bits / col_bits (atomicMax: order-independent), and the tensor amax. */
template <int PRO> __global__ void __launch_bounds__(S1_THREADS) s1_amax_kernel(sq_args a) {
    __shared__ unsigned sm_cm[8][SQ_TILE];
    const int tid = threadIdx.x, tx = tid & 31, ty = tid >> 5;
    const int r0 = (int)(blockIdx.x / a.tiles_c) * SQ_TILE;
    const int c0 = (int)(blockIdx.x % a.tiles_c) * SQ_TILE;
    float4 v[16];
    s1_load<PRO>(v, a, r0, c0, tx, ty);
    unsigned cm[4] = {0u, 0u, 0u, 0u}, all = 0u;
#pragma unroll
    for (int k = 0; k < 16; k++) {
        cm[0] = max(cm[0], abs_bits_dev(v[k].x));
        cm[1] = max(cm[1], abs_bits_dev(v[k].y));
        cm[2] = max(cm[2], abs_bits_dev(v[k].z));
        cm[3] = max(cm[3], abs_bits_dev(v[k].w));
        const unsigned rm = __reduce_max_sync(0xffffffffu, abs_bits4_dev(0u, v[k]));
        const int r = r0 + 16 * ty + k;
        if (tx == 0 && r < a.rows) atomicMax(a.row_bits + r, rm);
        all = max(all, rm);
    }
#pragma unroll
    for (int j = 0; j < 4; j++) sm_cm[ty][4 * tx + j] = cm[j];
    __syncthreads();
    if (tid < SQ_TILE && c0 + tid < a.cols) {
        unsigned m = 0u;
        for (int w = 0; w < 8; w++) m = max(m, sm_cm[w][tid]);
        atomicMax(a.col_bits + c0 + tid, m);
    }
    if (a.amax_out) block_amax_bits_merge(a.amax_out, all);
}

template <fp8_format FMT, int KIND, int PRO, bool COLSUM>
__global__ void __launch_bounds__(S1_THREADS) s1_tile_kernel(sq_args a) {
    __shared__ uint4 sm_t[SQ_TILE * 8];                 /* [column][chunk of 16 rows], swizzled */
    __shared__ unsigned sm_cm[8][SQ_TILE];              /* column amax bits per warp */
    __shared__ float sm_cs[SQ_TILE];                    /* column scales */
    __shared__ __align__(16) float sm_part[8][SQ_TILE]; /* COLSUM: per-warp column sums */
    const __nv_fp8_interpretation_t it = FMT == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2;
    const int tid = threadIdx.x, tx = tid & 31, ty = tid >> 5;
    const int tr = (int)(blockIdx.x / a.tiles_c), tcol = (int)(blockIdx.x % a.tiles_c);
    const int r0 = tr * SQ_TILE, c0 = tcol * SQ_TILE;
    const int nr = min(SQ_TILE, a.rows - r0), nc = min(SQ_TILE, a.cols - c0);
    float4 v[16];
    s1_load<PRO>(v, a, r0, c0, tx, ty);

    /* row amaxes (VEC, BLK) */
    unsigned rmax[16];
    unsigned all = 0u;
    if (KIND != SQ_ROW) {
#pragma unroll
        for (int k = 0; k < 16; k++) {
            rmax[k] = __reduce_max_sync(0xffffffffu, abs_bits4_dev(0u, v[k]));
            all = max(all, rmax[k]);
        }
    }
    /* column scales into sm_cs */
    if (KIND == SQ_VEC) {
        unsigned cm[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int k = 0; k < 16; k++) {
            cm[0] = max(cm[0], abs_bits_dev(v[k].x));
            cm[1] = max(cm[1], abs_bits_dev(v[k].y));
            cm[2] = max(cm[2], abs_bits_dev(v[k].z));
            cm[3] = max(cm[3], abs_bits_dev(v[k].w));
        }
#pragma unroll
        for (int j = 0; j < 4; j++) sm_cm[ty][4 * tx + j] = cm[j];
        __syncthreads();
        if (tid < SQ_TILE) {
            unsigned m = 0u;
            for (int w = 0; w < 8; w++) m = max(m, sm_cm[w][tid]);
            const float sc = current_scale_dev(bits_amax(m), a.fmt_max, 0.0f, a.pow2);
            sm_cs[tid] = sc;
            if (a.codes_t && tid < nc) /* operand [cols, rows], row c0 + tid, tile r0 / 128 */
                a.sinv_t[(size_t)tr * fp8t_pad4(a.cols) + c0 + tid] = 1.0f / sc;
        }
    } else if (KIND == SQ_BLK) {
        if (tx == 0) sm_cm[0][ty] = all;
        __syncthreads();
        if (tid == 0) {
            unsigned m = 0u;
            for (int w = 0; w < 8; w++) m = max(m, sm_cm[0][w]);
            const float sc = current_scale_dev(bits_amax(m), a.fmt_max, 0.0f, a.pow2);
            sm_cs[0] = sc;
            const int kbr = (a.cols + 127) / 128, kbt = (a.rows + 127) / 128;
            if (a.codes) a.sinv[(size_t)tr * fp8t_pad4(kbr) + tcol] = 1.0f / sc;
            if (a.codes_t) a.sinv_t[(size_t)tcol * fp8t_pad4(kbt) + tr] = 1.0f / sc;
        }
    } else { /* ROW: the first pass's column amaxes */
        if (tid < SQ_TILE) {
            const float sc =
                c0 + tid < a.cols
                    ? current_scale_dev(bits_amax(a.col_bits[c0 + tid]), a.fmt_max, 0.0f, a.pow2)
                    : 1.0f;
            sm_cs[tid] = sc;
            if (a.codes_t && tr == 0 && tid < nc) a.sinv_t[c0 + tid] = 1.0f / sc;
        }
    }
    if (COLSUM) {
        float4 cs = v[0];
#pragma unroll
        for (int k = 1; k < 16; k++)
            cs = make_float4(cs.x + v[k].x, cs.y + v[k].y, cs.z + v[k].z, cs.w + v[k].w);
        *(float4 *)&sm_part[ty][4 * tx] = cs;
    }
    __syncthreads();
    if (COLSUM && tid < nc) {
        float t = sm_part[0][tid];
        for (int w = 1; w < 8; w++) t += sm_part[w][tid];
        a.part[(size_t)tr * a.cols + c0 + tid] = t;
    }

    const int c = c0 + 4 * tx;
    const bool col_ok = 4 * tx < nc;
    /* row-major codes with the row scales */
    if (a.codes) {
        const float sblk = KIND == SQ_BLK ? sm_cs[0] : 0.0f;
#pragma unroll
        for (int k = 0; k < 16; k++) {
            const int rl = 16 * ty + k, r = r0 + rl;
            float sc;
            if (KIND == SQ_BLK)
                sc = sblk;
            else if (KIND == SQ_VEC)
                sc = current_scale_dev(bits_amax(rmax[k]), a.fmt_max, 0.0f, a.pow2);
            else
                sc = current_scale_dev(bits_amax(r < a.rows ? a.row_bits[r] : 0u), a.fmt_max,
                                       0.0f, a.pow2);
            if (rl < nr) {
                if (col_ok)
                    *(uint32_t *)(a.codes + (size_t)r * a.cols + c) =
                        fp8x4_enc_dev(v[k].x * sc, v[k].y * sc, v[k].z * sc, v[k].w * sc, FMT);
                if (tx == 0 && KIND == SQ_VEC)
                    a.sinv[(size_t)tcol * fp8t_pad4(a.rows) + r] = 1.0f / sc;
                if (tx == 0 && KIND == SQ_ROW && tcol == 0) a.sinv[r] = 1.0f / sc;
            }
        }
    }
    if (!a.codes_t) {
        if (a.amax_out && KIND != SQ_ROW) block_amax_bits_merge(a.amax_out, all);
        return;
    }
    /* transposed codes with the column scales: column 4tx + j's 16 rows as one uint4 */
    const int swz = tx & 7;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float sc = sm_cs[KIND == SQ_BLK ? 0 : 4 * tx + j];
        uint32_t w[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            float e[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float4 t = v[4 * q + i];
                e[i] = (j == 0 ? t.x : j == 1 ? t.y : j == 2 ? t.z : t.w) * sc;
            }
            const uint32_t lo =
                __nv_cvt_float2_to_fp8x2(make_float2(e[0], e[1]), __NV_SATFINITE, it);
            const uint32_t hi =
                __nv_cvt_float2_to_fp8x2(make_float2(e[2], e[3]), __NV_SATFINITE, it);
            w[q] = lo | (hi << 16);
        }
        sm_t[(4 * tx + j) * 8 + (ty ^ swz)] = make_uint4(w[0], w[1], w[2], w[3]);
    }
    __syncthreads();
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const int cl = (tid >> 3) + 32 * p, k = tid & 7;
        if (cl < nc && 16 * k < nr) {
            const uint4 o = sm_t[cl * 8 + (k ^ ((cl >> 2) & 7))];
            *(uint4 *)(a.codes_t + (size_t)(c0 + cl) * a.rows + r0 + 16 * k) = o;
        }
    }
    if (a.amax_out && KIND != SQ_ROW) block_amax_bits_merge(a.amax_out, all);
}

/* version 1's host side: cuda_quantize_scaled's fused path with the version 1 kernels (what
 * the shipped version does not fuse goes to it) */
template <fp8_format FMT, int KIND, int PRO>
static void s1_launch_cs(cuda_state *s, const sq_args &a, unsigned tiles, int colsum) {
    if (colsum)
        s1_tile_kernel<FMT, KIND, PRO, true><<<tiles, S1_THREADS, 0, s->stream>>>(a);
    else
        s1_tile_kernel<FMT, KIND, PRO, false><<<tiles, S1_THREADS, 0, s->stream>>>(a);
    CUDA_LAUNCH_CHECK(s);
}
template <fp8_format FMT, int KIND>
static void s1_launch_pro(cuda_state *s, const sq_args &a, unsigned tiles, int pro, int colsum) {
    if (pro == SQ_GELU)
        s1_launch_cs<FMT, KIND, SQ_GELU>(s, a, tiles, colsum);
    else if (pro == SQ_DGELU)
        s1_launch_cs<FMT, KIND, SQ_DGELU>(s, a, tiles, colsum);
    else
        s1_launch_cs<FMT, KIND, SQ_PLAIN>(s, a, tiles, colsum);
}
template <fp8_format FMT>
static void s1_launch_kind(cuda_state *s, const sq_args &a, unsigned tiles, int kind, int pro,
                           int colsum) {
    if (kind == SQ_VEC)
        s1_launch_pro<FMT, SQ_VEC>(s, a, tiles, pro, colsum);
    else if (kind == SQ_BLK)
        s1_launch_pro<FMT, SQ_BLK>(s, a, tiles, pro, colsum);
    else
        s1_launch_pro<FMT, SQ_ROW>(s, a, tiles, pro, colsum);
}

static void quantize_scaled_v1(fp8t_backend *b, const fp8t_scaled_quant *q) {
    const int rows = q->rows, cols = q->cols;
    cuda_state *s = cuda_of(b);
    const int fused = rows > 0 && cols > 0 && (q->codes || q->codes_t || q->colsum) &&
                      rows % 16 == 0 && cols % 4 == 0 && aligned16(q->x) &&
                      aligned16(q->gelu_x) && aligned16(q->gelu_x16) &&
                      aligned16(q->gelu_save16) && (!q->bias || aligned16(q->bias)) &&
                      (!q->codes || aligned4(q->codes)) && (!q->codes_t || aligned16(q->codes_t));
    if (!fused) {
        cuda_quantize_scaled(b, q);
        return;
    }
    const int pro = q->gelu ? SQ_GELU : (q->gelu_x || q->gelu_x16) ? SQ_DGELU : SQ_PLAIN;
    const int tiles_r = (rows + SQ_TILE - 1) / SQ_TILE, tiles_c = (cols + SQ_TILE - 1) / SQ_TILE;
    const unsigned tiles = (unsigned)((size_t)tiles_r * tiles_c);
    sq_args a;
    memset(&a, 0, sizeof(a));
    a.codes = q->codes, a.codes_t = q->codes_t;
    a.sinv = q->scale_inv, a.sinv_t = q->scale_inv_t;
    a.amax_out = q->amax_out;
    a.x = q->x, a.gx = q->gelu_x, a.bias = q->bias;
    a.gx16 = q->gelu_x16, a.save16 = q->gelu_save16;
    a.rows = rows, a.cols = cols, a.tiles_c = tiles_c;
    a.fmt_max = q->fmt == FP8_E4M3 ? FP8_E4M3_MAX : FP8_E5M2_MAX;
    a.pow2 = q->pow2;
    if (q->colsum)
        a.part = (float *)cuda_scratch(b, SCR_COLSUM, (size_t)tiles_r * cols * sizeof(float));
    const int kind = q->scaling == FP8T_SCALING_VEC128   ? SQ_VEC
                     : q->scaling == FP8T_SCALING_BLK128 ? SQ_BLK
                                                         : SQ_ROW;
    if (kind == SQ_ROW) {
        unsigned *bits = (unsigned *)cuda_scratch(
            b, SCR_QUANT, ((size_t)rows + (size_t)cols) * sizeof(unsigned));
        a.row_bits = bits, a.col_bits = bits + rows;
        CUDA_CHECK(cudaMemsetAsync(bits, 0, ((size_t)rows + cols) * sizeof(unsigned), s->stream));
        sq_args a1 = a;
        a1.save16 = NULL;
        if (pro == SQ_GELU)
            s1_amax_kernel<SQ_GELU><<<tiles, S1_THREADS, 0, s->stream>>>(a1);
        else if (pro == SQ_DGELU)
            s1_amax_kernel<SQ_DGELU><<<tiles, S1_THREADS, 0, s->stream>>>(a1);
        else
            s1_amax_kernel<SQ_PLAIN><<<tiles, S1_THREADS, 0, s->stream>>>(a1);
        CUDA_LAUNCH_CHECK(s);
        a.amax_out = NULL;
    }
    if (q->codes || q->codes_t || q->colsum) {
        const int cs = q->colsum != NULL;
        if (q->fmt == FP8_E4M3)
            s1_launch_kind<FP8_E4M3>(s, a, tiles, kind, pro, cs);
        else
            s1_launch_kind<FP8_E5M2>(s, a, tiles, kind, pro, cs);
    }
    if (q->colsum) cuda_column_sums_finish(b, q->colsum, a.part, tiles_r, cols);
}

static void run_scaled(int version, const fp8t_scaled_quant *q) {
    if (version == 1)
        quantize_scaled_v1(&g_be, q);
    else
        cuda_quantize_scaled(&g_be, q);
}

/* One scaled request's device buffers: every output with guard room, filled with 0xA5 */
typedef struct {
    float *x, *gx, *bias, *sinv, *sinv_t, *amax, *colsum;
    uint16_t *gx16, *save16;
    uint8_t *codes, *codes_t;
    size_t n, nscale;
} sq_bufs;

static size_t sq_scale_count(int rows, int cols) {
    const size_t tr = (size_t)(rows + 127) / 128, tc = (size_t)(cols + 127) / 128;
    size_t m = tc * fp8t_pad4(rows);
    m = tr * fp8t_pad4(cols) > m ? tr * fp8t_pad4(cols) : m;
    m = tr * fp8t_pad4((int)tc) > m ? tr * fp8t_pad4((int)tc) : m;
    m = tc * fp8t_pad4((int)tr) > m ? tc * fp8t_pad4((int)tr) : m;
    return m + (size_t)rows + (size_t)cols + 64;
}

static void sq_alloc(sq_bufs *d, int rows, int cols) {
    d->n = (size_t)rows * cols;
    d->nscale = sq_scale_count(rows, cols);
    CUDA_CHECK(cudaMalloc(&d->x, d->n * 4));
    CUDA_CHECK(cudaMalloc(&d->gx, d->n * 4));
    CUDA_CHECK(cudaMalloc(&d->gx16, d->n * 2));
    CUDA_CHECK(cudaMalloc(&d->save16, d->n * 2));
    CUDA_CHECK(cudaMalloc(&d->bias, (size_t)cols * 4));
    CUDA_CHECK(cudaMalloc(&d->colsum, (size_t)cols * 4));
    CUDA_CHECK(cudaMalloc(&d->codes, d->n));
    CUDA_CHECK(cudaMalloc(&d->codes_t, d->n));
    CUDA_CHECK(cudaMalloc(&d->sinv, d->nscale * 4));
    CUDA_CHECK(cudaMalloc(&d->sinv_t, d->nscale * 4));
    CUDA_CHECK(cudaMalloc(&d->amax, 4));
}

static void sq_free(sq_bufs *d) {
    cudaFree(d->x), cudaFree(d->gx), cudaFree(d->gx16), cudaFree(d->save16), cudaFree(d->bias);
    cudaFree(d->colsum), cudaFree(d->codes), cudaFree(d->codes_t), cudaFree(d->sinv);
    cudaFree(d->sinv_t), cudaFree(d->amax);
}

/* the outputs (everything a version may write) into one host vector */
static std::vector<uint8_t> sq_outputs(const sq_bufs *d, int cols) {
    std::vector<uint8_t> h(d->n * 4 + d->nscale * 8 + (size_t)cols * 4 + 4);
    uint8_t *p = h.data();
    CUDA_CHECK(cudaMemcpy(p, d->codes, d->n, cudaMemcpyDeviceToHost));
    p += d->n;
    CUDA_CHECK(cudaMemcpy(p, d->codes_t, d->n, cudaMemcpyDeviceToHost));
    p += d->n;
    CUDA_CHECK(cudaMemcpy(p, d->save16, d->n * 2, cudaMemcpyDeviceToHost));
    p += d->n * 2;
    CUDA_CHECK(cudaMemcpy(p, d->sinv, d->nscale * 4, cudaMemcpyDeviceToHost));
    p += d->nscale * 4;
    CUDA_CHECK(cudaMemcpy(p, d->sinv_t, d->nscale * 4, cudaMemcpyDeviceToHost));
    p += d->nscale * 4;
    CUDA_CHECK(cudaMemcpy(p, d->colsum, (size_t)cols * 4, cudaMemcpyDeviceToHost));
    p += (size_t)cols * 4;
    CUDA_CHECK(cudaMemcpy(p, d->amax, 4, cudaMemcpyDeviceToHost));
    return h;
}

static void sq_reset_outputs(const sq_bufs *d, int cols) {
    const float amax0 = 0.25f;
    CUDA_CHECK(cudaMemset(d->codes, 0xA5, d->n));
    CUDA_CHECK(cudaMemset(d->codes_t, 0xA5, d->n));
    CUDA_CHECK(cudaMemset(d->save16, 0xA5, d->n * 2));
    CUDA_CHECK(cudaMemset(d->sinv, 0xA5, d->nscale * 4));
    CUDA_CHECK(cudaMemset(d->sinv_t, 0xA5, d->nscale * 4));
    std::vector<float> cs0(cols);
    for (int c = 0; c < cols; c++) cs0[c] = 0.5f * (float)(c % 7) - 1.0f;
    CUDA_CHECK(cudaMemcpy(d->colsum, cs0.data(), (size_t)cols * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d->amax, &amax0, 4, cudaMemcpyHostToDevice));
}

enum { SQP_PLAIN, SQP_GELU_SAVE, SQP_GELU_BIAS, SQP_DGELU16, SQP_DGELU_BIAS, SQP_COUNT };
static const char *const sqp_names[SQP_COUNT] = {"plain", "gelu+save16", "gelu+bias+save16",
                                                 "dgelu(x16)", "dgelu(x)+bias"};

static fp8t_scaled_quant sq_request(const sq_bufs *d, int rows, int cols, fp8t_fp8_scaling sc,
                                    fp8_format fmt, int pro, int colsum, int want_codes,
                                    int want_t, int pow2) {
    fp8t_scaled_quant q;
    memset(&q, 0, sizeof(q));
    q.codes = want_codes ? d->codes : NULL;
    q.scale_inv = d->sinv;
    q.codes_t = want_t ? d->codes_t : NULL;
    q.scale_inv_t = d->sinv_t;
    q.amax_out = d->amax;
    q.colsum = colsum ? d->colsum : NULL;
    q.x = d->x;
    q.gelu = pro == SQP_GELU_SAVE || pro == SQP_GELU_BIAS;
    q.gelu_save16 = q.gelu ? d->save16 : NULL;
    q.gelu_x = pro == SQP_DGELU_BIAS ? d->gx : NULL;
    q.gelu_x16 = pro == SQP_DGELU16 ? d->gx16 : NULL;
    q.bias = pro == SQP_GELU_BIAS || pro == SQP_DGELU_BIAS ? d->bias : NULL;
    q.rows = rows, q.cols = cols;
    q.scaling = sc;
    q.fmt = fmt;
    q.pow2 = pow2;
    return q;
}

static void sq_fill_inputs(const sq_bufs *d, int rows, int cols, int kind) {
    std::vector<float> h(d->n), g(d->n), bias(cols);
    std::vector<uint16_t> g16(d->n);
    fill_data(h.data(), d->n, kind);
    for (size_t i = 0; i < d->n; i++) {
        g[i] = 2.0f * rnd_normal();
        uint32_t u;
        memcpy(&u, &g[i], 4);
        g16[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    for (int c = 0; c < cols; c++) bias[c] = 0.1f * rnd_normal();
    (void)rows;
    CUDA_CHECK(cudaMemcpy(d->x, h.data(), d->n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d->gx, g.data(), d->n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d->gx16, g16.data(), d->n * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d->bias, bias.data(), (size_t)cols * 4, cudaMemcpyHostToDevice));
}

static const fp8t_fp8_scaling sq_kinds[3] = {FP8T_SCALING_VEC128, FP8T_SCALING_BLK128,
                                             FP8T_SCALING_ROW};
static const char *const sq_kind_names[3] = {"vec128", "blk128", "row"};

/* version 2 against version 1, every output byte for byte */
static void run_scaled_checks(void) {
    static const int shapes[][2] = {{16, 4}, {48, 132}, {144, 200}, {256, 1600}, {272, 516}};
    static const int outs[][2] = {{1, 1}, {1, 0}, {0, 1}};
    int pass0 = n_pass, fail0 = n_fail;
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        const int rows = shapes[si][0], cols = shapes[si][1];
        sq_bufs d;
        sq_alloc(&d, rows, cols);
        sq_fill_inputs(&d, rows, cols, (int)(si % 3));
        for (int ki = 0; ki < 3; ki++)
            for (int pro = 0; pro < SQP_COUNT; pro++)
                for (int colsum = 0; colsum < 2; colsum++)
                    for (int fi = 0; fi < 2; fi++)
                        for (int oi = 0; oi < 3; oi++) {
                            const int pow2 = (ki + pro + oi) & 1;
                            const fp8_format fmt = fi ? FP8_E5M2 : FP8_E4M3;
                            fp8t_scaled_quant q =
                                sq_request(&d, rows, cols, sq_kinds[ki], fmt, pro, colsum,
                                           outs[oi][0], outs[oi][1], pow2);
                            std::vector<uint8_t> want, got;
                            for (int version = 1; version <= 2; version++) {
                                sq_reset_outputs(&d, cols);
                                run_scaled(version, &q);
                                CUDA_CHECK(cudaDeviceSynchronize());
                                (version == 1 ? want : got) = sq_outputs(&d, cols);
                            }
                            size_t first = 0;
                            while (first < want.size() && want[first] == got[first]) first++;
                            const int ok = first == want.size();
                            ok ? n_pass++ : n_fail++;
                            if (!ok || getenv("LADDER_VERBOSE"))
                                printf("%s  scaled v2 == v1: %dx%d %s %s colsum=%d %s codes=%d "
                                       "codes_t=%d pow2=%d%s%zu\n",
                                       ok ? "PASS" : "FAIL", rows, cols, sq_kind_names[ki],
                                       sqp_names[pro], colsum, fi ? "e5m2" : "e4m3", outs[oi][0],
                                       outs[oi][1], pow2,
                                       ok ? "" : " first differing output byte ", ok ? 0 : first);
                        }
        sq_free(&d);
    }
    printf("scaled checks: %d passed, %d failed\n", n_pass - pass0, n_fail - fail0);
}

/* each version on the training shapes that make block and row operands, L2 flushed before
 * each launch; GB/s counts x (4 bytes), GELU's BF16 input (2) and save (2) and each code */
static void bench_scaled(int iters) {
    static const struct {
        int rows, cols, kind, pro, colsum;
        const char *what;
    } cases[] = {
        {16384, 1600, 0, SQP_PLAIN, 0, "1.5B ln1/ln2/atty X"},
        {16384, 6400, 0, SQP_GELU_BIAS, 0, "1.5B fc2 X (GELU)"},
        {16384, 6400, 0, SQP_DGELU16, 1, "1.5B fc1 dY (dGELU)"},
        {16384, 4800, 0, SQP_PLAIN, 1, "1.5B qkv dY"},
        {16384, 1600, 0, SQP_PLAIN, 1, "1.5B attproj/fc2 dY"},
        {16384, 2048, 0, SQP_PLAIN, 0, "llama X / dY"},
        {16384, 8192, 0, SQP_PLAIN, 0, "llama down X"},
        {16384, 2048, 2, SQP_PLAIN, 0, "llama rowwise X"},
        {16384, 8192, 2, SQP_PLAIN, 0, "llama rowwise down X"},
        {8192, 2048, 1, SQP_PLAIN, 0, "llama weight 128x128"},
    };
    const size_t flush_bytes = (size_t)256 << 20;
    uint8_t *flush;
    CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    printf("\n%-24s %-12s %-7s %-17s %-3s %9s %8s %7s\n", "case", "shape", "kind", "prologue",
           "ver", "time_us", "GB/s", "vs v1");
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const int rows = cases[ci].rows, cols = cases[ci].cols;
        sq_bufs d;
        sq_alloc(&d, rows, cols);
        sq_fill_inputs(&d, rows, cols, 0);
        fp8t_scaled_quant q = sq_request(&d, rows, cols, sq_kinds[cases[ci].kind], FP8_E4M3,
                                         cases[ci].pro, cases[ci].colsum, 1, 1, 0);
        /* the timed request gives version 1's bytes */
        std::vector<uint8_t> want, got;
        for (int version = 1; version <= 2; version++) {
            sq_reset_outputs(&d, cols);
            run_scaled(version, &q);
            CUDA_CHECK(cudaDeviceSynchronize());
            (version == 1 ? want : got) = sq_outputs(&d, cols);
        }
        const int same = want == got;
        same ? n_pass++ : n_fail++;
        double bytes = (double)d.n * (4 + 2);
        if (q.gelu_x16) bytes += (double)d.n * 2;
        if (q.gelu_x) bytes += (double)d.n * 4;
        if (q.gelu_save16) bytes += (double)d.n * 2;
        if (q.scaling == FP8T_SCALING_ROW) bytes += (double)d.n * 4; /* the amax pass's read */
        double us_v1 = 0.0;
        for (int version = 1; version <= 2; version++) {
            double total_ms = 0.0;
            for (int it = -2; it < iters; it++) {
                CUDA_CHECK(cudaMemsetAsync(flush, it & 0xff, flush_bytes, g_state.stream));
                CUDA_CHECK(cudaEventRecord(e0, g_state.stream));
                run_scaled(version, &q);
                CUDA_CHECK(cudaEventRecord(e1, g_state.stream));
                CUDA_CHECK(cudaEventSynchronize(e1));
                float ms;
                CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                if (it >= 0) total_ms += ms;
            }
            const double us = total_ms * 1000.0 / iters;
            if (version == 1) us_v1 = us;
            char shape[32], rel[16] = "";
            snprintf(shape, sizeof(shape), "%dx%d", rows, cols);
            if (version == 2) snprintf(rel, sizeof(rel), "%.2fx", us_v1 / us);
            printf("%-24s %-12s %-7s %-17s v%-2d %9.1f %8.1f %7s%s\n", cases[ci].what, shape,
                   sq_kind_names[cases[ci].kind], sqp_names[cases[ci].pro], version, us,
                   bytes / (us * 1e3), rel,
                   version == 2 && !same ? "  (bytes DIFFER: FAIL)" : "");
        }
        sq_free(&d);
    }
    cudaFree(flush);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 20;
    const char *part = argc > 2 ? argv[2] : "all";
    const int per_tensor = !strcmp(part, "all") || !strcmp(part, "per-tensor");
    const int scaled = !strcmp(part, "all") || !strcmp(part, "scaled");
    if (iters < 1 || (!per_tensor && !scaled)) {
        fprintf(stderr, "usage: %s [iters >= 1] [all|per-tensor|scaled]\n", argv[0]);
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

    if (per_tensor) run_checks();
    if (scaled) run_scaled_checks();
    if (n_fail) {
        printf("checks failed: not timing\n");
        return 1;
    }
    if (per_tensor) bench(iters);
    if (scaled) bench_scaled(iters);
    printf("\n%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
