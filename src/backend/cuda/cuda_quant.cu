/* CUDA backend — quantization: amax, fused cast + transpose + amax, scales, fake quantization
 * (per-tensor, block, MXFP8), BF16 rounding, the delayed-scaling update.
 *
 * Encoding is __nv_cvt_float_to_fp8(.., __NV_SATFINITE, ..) (see fp8_enc_dev), bit-identical
 * to fp8_encode(x, fmt, 1), or its two-value form __nv_cvt_float2_to_fp8x2 (the same
 * instruction); the product x * scale is one IEEE multiply, as on the CPU. */
#include "backend/cuda/cuda_common.cuh"

#define EW_THREADS 256

static unsigned ew_blocks(cuda_state *s, size_t n, size_t per_thread) {
    size_t want = (n + EW_THREADS * per_thread - 1) / (EW_THREADS * per_thread);
    size_t cap = (size_t)s->num_sms * 16;
    if (want < 1) want = 1;
    return (unsigned)(want < cap ? want : cap);
}

/* ---------------------------------------------------------------------------------------- */
/* amax */

__global__ void amax_kernel(float *amax_out, const float *__restrict__ x, size_t n, int vec) {
    float acc = 0.0f;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t done = 0;
    if (vec) {
        const float4 *x4 = (const float4 *)x;
        size_t n4 = n / 4;
        for (size_t i = i0; i < n4; i += stride) {
            float4 v = x4[i];
            acc = amax_merge_dev(acc, v.x);
            acc = amax_merge_dev(acc, v.y);
            acc = amax_merge_dev(acc, v.z);
            acc = amax_merge_dev(acc, v.w);
        }
        done = n4 * 4;
    }
    for (size_t i = done + i0; i < n; i += stride) acc = amax_merge_dev(acc, x[i]);
    acc = block_amax(acc);
    if (threadIdx.x == 0) atomic_amax_merge(amax_out, acc);
}

void cuda_amax(fp8t_backend *b, float *amax_out, const float *x, size_t n) {
    if (n == 0) return; /* amax of nothing is 0: max(*amax_out, 0) changes nothing */
    cuda_state *s = cuda_of(b);
    amax_kernel<<<ew_blocks(s, n, 8), EW_THREADS, 0, s->stream>>>(amax_out, x, n, aligned16(x));
    CUDA_LAUNCH_CHECK(s);
}

/* ---------------------------------------------------------------------------------------- */
/* quantize: codes = fp8(x * scale), optional transposed codes, optional amax */

/* Row-major cast (no transpose): 4 elements per thread with 16-byte loads when aligned. */
__global__ void cast_fp8_kernel(uint8_t *codes, float *amax_out, const float *__restrict__ x,
                                size_t n, fp8_format fmt, const float *scale_p, int vec) {
    float scale = *scale_p;
    float acc = 0.0f;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t done = 0;
    if (vec) {
        const float4 *x4 = (const float4 *)x;
        uchar4 *c4 = (uchar4 *)codes;
        size_t n4 = n / 4;
        for (size_t i = i0; i < n4; i += stride) {
            float4 v = x4[i];
            acc = amax_merge_dev(acc, v.x);
            acc = amax_merge_dev(acc, v.y);
            acc = amax_merge_dev(acc, v.z);
            acc = amax_merge_dev(acc, v.w);
            if (codes) {
                uchar4 c;
                c.x = fp8_enc_dev(v.x * scale, fmt);
                c.y = fp8_enc_dev(v.y * scale, fmt);
                c.z = fp8_enc_dev(v.z * scale, fmt);
                c.w = fp8_enc_dev(v.w * scale, fmt);
                c4[i] = c;
            }
        }
        done = n4 * 4;
    }
    for (size_t i = done + i0; i < n; i += stride) {
        float v = x[i];
        acc = amax_merge_dev(acc, v);
        if (codes) codes[i] = fp8_enc_dev(v * scale, fmt);
    }
    if (amax_out) {
        acc = block_amax(acc);
        if (threadIdx.x == 0) atomic_amax_merge(amax_out, acc);
    }
}

/* ---- fused paths (not with the plain option) ----
 *
 * amax as an unsigned max over |x| bit patterns: for non-NaN floats the order of the patterns
 * is the order of the magnitudes and every NaN pattern lies above +Inf's, so the max is a NaN
 * pattern exactly when some element is NaN (the rule of amax_merge_dev and of the CPU's
 * fp8_amax). Any NaN is merged as the canonical 0x7FC00000, so the result does not depend on
 * which NaN a block saw first. */
__device__ __forceinline__ unsigned abs_bits_dev(float v) {
    return __float_as_uint(v) & 0x7fffffffu;
}

__device__ __forceinline__ unsigned abs_bits4_dev(unsigned m, float4 v) {
    m = max(m, abs_bits_dev(v.x));
    m = max(m, abs_bits_dev(v.y));
    m = max(m, abs_bits_dev(v.z));
    return max(m, abs_bits_dev(v.w));
}

/* Block-wide max of each thread's m, merged into *amax_out. Every thread of the (1-D) block
 * must call it; blockDim.x a multiple of 32. */
__device__ __forceinline__ void block_amax_bits_merge(float *amax_out, unsigned m) {
    __shared__ unsigned sh_m[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    m = __reduce_max_sync(0xffffffffu, m);
    if (lane == 0) sh_m[warp] = m;
    __syncthreads();
    if (warp == 0) {
        m = lane < (int)(blockDim.x >> 5) ? sh_m[lane] : 0u;
        m = __reduce_max_sync(0xffffffffu, m);
        if (lane == 0)
            atomic_amax_merge(amax_out, __uint_as_float(m > 0x7f800000u ? 0x7fc00000u : m));
    }
}

/* Row-major cast (+ amax), no transpose: each thread loads CAST_UNROLL float4 spaced a block
 * apart (every warp load is 512 contiguous bytes, and 4 of them are in flight per thread
 * before the first use) and stores 4 codes per float4 (a warp store is 128 contiguous bytes).
 * Needs x 16-byte and codes 4-byte aligned; codes may be NULL (amax only). One block per
 * CAST_THREADS * CAST_UNROLL float4; block 0 also does the last n % 4 elements. */
#define CAST_THREADS 256
#define CAST_UNROLL 4
/* GELU: the values cast are gelu_dev(x (+ bias[col])) (quantize_gelu's codes-only request, as
 * bias_add then gelu_forward then this cast compute them); save16 (or NULL) keeps GELU's input
 * in BF16 (bf16_pack's bits). Needs cols % 4 == 0 with a bias or save16.
 * SW (1 SwiGLU, 2 / 3 its gate's / up's gradient): the values are swiglu_step4's of x with
 * gate / gate16, up / up16, save16 / save16b (quantize_swiglu's codes-only request). Needs
 * n % 4 == 0. */
template <fp8_format FMT, bool GELU, int SW = 0>
__global__ void __launch_bounds__(CAST_THREADS)
    cast_fp8_vec_kernel(uint8_t *codes, float *amax_out, const float *__restrict__ x, size_t n,
                        const float *scale_p, const float *__restrict__ bias, int cols,
                        uint16_t *save16, const float *__restrict__ gate = NULL,
                        const uint16_t *__restrict__ gate16 = NULL,
                        const float *__restrict__ up = NULL,
                        const uint16_t *__restrict__ up16 = NULL, uint16_t *save16b = NULL) {
    const float scale = *scale_p;
    const size_t n4 = n / 4;
    const float4 *x4 = (const float4 *)x;
    uint32_t *c4 = (uint32_t *)codes;
    const size_t base = (size_t)blockIdx.x * (CAST_THREADS * CAST_UNROLL) + threadIdx.x;
    float4 v[CAST_UNROLL];
#pragma unroll
    for (int u = 0; u < CAST_UNROLL; u++) {
        size_t i = base + (size_t)u * CAST_THREADS;
        v[u] = i < n4 ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (GELU && i < n4) {
            if (bias) {
                /* a 64-bit remainder is a long software sequence per element group: the
                 * 32-bit one wherever the index fits */
                const size_t e = 4 * i;
                const size_t c =
                    n <= 0xffffffffu ? (size_t)((unsigned)e % (unsigned)cols) : e % (size_t)cols;
                add_into(v[u], *(const float4 *)(bias + c));
            }
            if (save16) ((uint2 *)save16)[i] = bf16x4_of(v[u]);
            v[u] = make_float4(gelu_dev(v[u].x), gelu_dev(v[u].y), gelu_dev(v[u].z),
                               gelu_dev(v[u].w));
        }
        if (SW && i < n4)
            v[u] = swiglu_step4<SW>(v[u], 4 * i, gate, gate16, up, up16, save16, save16b);
    }
    unsigned m = 0; /* zeros for missing elements leave the max alone */
#pragma unroll
    for (int u = 0; u < CAST_UNROLL; u++) {
        size_t i = base + (size_t)u * CAST_THREADS;
        m = abs_bits4_dev(m, v[u]);
        if (codes && i < n4)
            c4[i] = fp8x4_enc_dev(v[u].x * scale, v[u].y * scale, v[u].z * scale, v[u].w * scale,
                                  FMT);
    }
    if (blockIdx.x == 0 && threadIdx.x < n - n4 * 4) {
        size_t i = n4 * 4 + threadIdx.x;
        float xi = x[i];
        if (GELU) { /* cols % 4 == 0 leaves no tail where a bias or save16 is given */
            xi = gelu_dev(xi);
        }
        m = max(m, abs_bits_dev(xi));
        if (codes) codes[i] = fp8_enc_dev(xi * scale, FMT);
    }
    if (amax_out) block_amax_bits_merge(amax_out, m);
}

/* Fused cast + transpose + amax over full 64x64 tiles, one tile per block of 256 threads.
 *   load:  thread (mc = tid % 16, mr = tid / 16) owns the 4x4 micro-block at rows
 *          r0 + 4mr .. +3, cols c0 + 4mc .. +3: four float4 loads (a warp reads 2 rows x 256
 *          contiguous bytes per load); the row-major codes go out as one 4-byte store per row
 *          (a warp writes 2 x 64 contiguous bytes).
 *   transpose: six byte permutes turn the 4 row words into 4 column words (byte i = row i);
 *          each goes to shared memory, laid out as codes_t's tile: column c holds 64 bytes =
 *          4 groups of 16 rows; group g of column c sits at slot g ^ ((c >> 3) & 3), and the
 *          thread writes its 4 columns rotated by mc, which keeps the writes to 2-way bank
 *          conflicts and the reads conflict-free (dev/cuda/quantize_ladder.cu checks this
 *          layout on the host: every word written once, read back in row order, banks).
 *   store: thread (c = tid / 4, k = tid % 4) writes rows r0 + 16k .. +15 of codes_t row c0 + c
 *          as one 16-byte store (a warp writes 8 x 64 contiguous bytes).
 * Needs cols % 4 == 0, x 16-byte aligned, codes 4-byte aligned (or NULL), rows % 16 == 0 and
 * codes_t 16-byte aligned. Tiles are numbered column-fastest so neighbouring blocks read
 * neighbouring parts of the same x rows. */
#define QT2_R 64 /* tile rows (contiguous within a codes_t row) */
#define QT2_C 64 /* tile columns */
#define QT2_THREADS 256
/* GELU: the values quantized are gelu_dev(x) (quantize_gelu), x being GELU's input.
 * GBWD: they are gelu_grad(gx (+ gbias), x) (gelu_backward_quantize_colsum), x being the
 * upstream gradient and gx GELU's input, read with the same layout as x.
 * COLSUM: part[tile row][c] = the sum of the tile's 64 values of column c (quantize_colsum):
 * each thread adds its 4 rows in order, then the 16 threads of a column group add theirs in
 * mr order (a fixed order: the result depends only on the shape). */
/* SW (1 SwiGLU, 2 / 3 its gate's / up's gradient; GELU, GBWD and COLSUM false): the values are
 * swiglu_step4's of x with gx / gx16 the gate, ux / ux16 up, save16 / save16b the saves
 * (quantize_swiglu).
 * vals (or NULL): the values quantized written there in FP32 too, [rows, cols] as x (what a
 * read-only hook is shown of GELU's output or of its backward's). */
template <fp8_format FMT, bool GELU, bool COLSUM, bool GBWD, int SW = 0>
__global__ void __launch_bounds__(QT2_THREADS)
    cast_transpose_fp8_tiled_kernel(uint8_t *codes, uint8_t *codes_t, float *amax_out,
                                    const float *__restrict__ x, int rows, int cols, int tiles_c,
                                    const float *scale_p, float *part,
                                    const float *__restrict__ gbias, const float *__restrict__ gx,
                                    const uint16_t *__restrict__ gx16, uint16_t *save16,
                                    const float *__restrict__ ux = NULL,
                                    const uint16_t *__restrict__ ux16 = NULL,
                                    uint16_t *save16b = NULL, float *vals = NULL) {
    __shared__ uint4 sm_t[QT2_C * QT2_R / 16]; /* [64 cols][4 groups of 16 row bytes] */
    uint32_t *sm_w = (uint32_t *)sm_t;         /* word (c, g, q) at c*16 + 4*(g^swz(c)) + q */
    const float scale = *scale_p;
    const int tid = threadIdx.x;
    const int r0 = (int)(blockIdx.x / tiles_c) * QT2_R, c0 = (int)(blockIdx.x % tiles_c) * QT2_C;
    const int mc = tid & 15, mr = tid >> 4;

    const float *xp = x + (size_t)(r0 + 4 * mr) * cols + c0 + 4 * mc;
    float4 v[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[i] = *(const float4 *)(xp + (size_t)i * cols);
        const size_t e0 = (size_t)(r0 + 4 * mr + i) * cols + c0 + 4 * mc; /* v[i].x's index */
        if (GBWD) {
            /* GELU's input, or its BF16 copy (which holds the bias) */
            float4 u =
                gx16 ? f32x4_of_bf16(*(const uint2 *)(gx16 + e0)) : *(const float4 *)(gx + e0);
            if (gbias) { /* GELU's input with the deferred bias, as gelu_backward_bias */
                float4 bb = *(const float4 *)(gbias + c0 + 4 * mc);
                u = make_float4(u.x + bb.x, u.y + bb.y, u.z + bb.z, u.w + bb.w);
            }
            v[i] = make_float4(gelu_grad(u.x, v[i].x), gelu_grad(u.y, v[i].y),
                               gelu_grad(u.z, v[i].z), gelu_grad(u.w, v[i].w));
        }
        if (GELU) {
            if (gbias) { /* the deferred bias: x + b rounded once, as bias_add */
                float4 bb = *(const float4 *)(gbias + c0 + 4 * mc);
                v[i] = make_float4(v[i].x + bb.x, v[i].y + bb.y, v[i].z + bb.z, v[i].w + bb.w);
            }
            if (save16) *(uint2 *)(save16 + e0) = bf16x4_of(v[i]); /* GELU's input (bf16_pack) */
            v[i] = make_float4(gelu_dev(v[i].x), gelu_dev(v[i].y), gelu_dev(v[i].z),
                               gelu_dev(v[i].w));
        }
        if (SW) v[i] = swiglu_step4<SW>(v[i], e0, gx, gx16, ux, ux16, save16, save16b);
        if (vals) *(float4 *)(vals + e0) = v[i];
    }
    unsigned m = 0;
    uint32_t rw[4]; /* rw[i]: codes of row 4mr+i, byte j = column 4mc+j */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        m = abs_bits4_dev(m, v[i]);
        rw[i] =
            fp8x4_enc_dev(v[i].x * scale, v[i].y * scale, v[i].z * scale, v[i].w * scale, FMT);
    }
    if (COLSUM) {
        __shared__ float4 sm_cs[16][16]; /* [mr][mc] */
        float4 cs = v[0];
#pragma unroll
        for (int i = 1; i < 4; i++)
            cs = make_float4(cs.x + v[i].x, cs.y + v[i].y, cs.z + v[i].z, cs.w + v[i].w);
        sm_cs[mr][mc] = cs;
        __syncthreads();
        if (mr == 0) {
            float4 t = sm_cs[0][mc];
            for (int k = 1; k < 16; k++) {
                float4 u = sm_cs[k][mc];
                t = make_float4(t.x + u.x, t.y + u.y, t.z + u.z, t.w + u.w);
            }
            *(float4 *)(part + (size_t)(r0 / QT2_R) * cols + c0 + 4 * mc) = t;
        }
    }
    if (codes) {
        uint8_t *cp = codes + (size_t)(r0 + 4 * mr) * cols + c0 + 4 * mc;
#pragma unroll
        for (int i = 0; i < 4; i++) *(uint32_t *)(cp + (size_t)i * cols) = rw[i];
    }
    /* 4x4 byte transpose: cw[j] byte i = rw[i] byte j */
    uint32_t a01 = __byte_perm(rw[0], rw[1], 0x5140); /* r0b0 r1b0 r0b1 r1b1 */
    uint32_t a23 = __byte_perm(rw[2], rw[3], 0x5140); /* r2b0 r3b0 r2b1 r3b1 */
    uint32_t b01 = __byte_perm(rw[0], rw[1], 0x7362); /* r0b2 r1b2 r0b3 r1b3 */
    uint32_t b23 = __byte_perm(rw[2], rw[3], 0x7362); /* r2b2 r3b2 r2b3 r3b3 */
    uint32_t cw0 = __byte_perm(a01, a23, 0x5410), cw1 = __byte_perm(a01, a23, 0x7632);
    uint32_t cw2 = __byte_perm(b01, b23, 0x5410), cw3 = __byte_perm(b01, b23, 0x7632);
    const int g = mr >> 2, q = mr & 3;
#pragma unroll
    for (int t = 0; t < 4; t++) {
        int j = (t + mc) & 3;
        uint32_t w = j == 0 ? cw0 : j == 1 ? cw1 : j == 2 ? cw2 : cw3;
        int c = 4 * mc + j;
        sm_w[c * 16 + 4 * (g ^ ((c >> 3) & 3)) + q] = w;
    }
    __syncthreads();
    {
        const int c = tid >> 2, k = tid & 3;
        uint4 o = sm_t[c * 4 + (k ^ ((c >> 3) & 3))];
        *(uint4 *)(codes_t + (size_t)(c0 + c) * rows + r0 + 16 * k) = o;
    }
    if (amax_out) block_amax_bits_merge(amax_out, m);
}

/* Generic fused cast + transpose + amax over the region rows [r_begin, r_end) x cols
 * [c_begin, c_end) of x [rows, cols]: one 32x32 tile per block of 32x8 threads, any shape or
 * alignment (the edges the 64x64 kernel leaves, or everything when its conditions fail).
 * Reads x once (coalesced along rows), writes codes (row-major, when non-NULL) and codes_t
 * through a shared-memory tile so both writes are coalesced. Tile rows are a loop over
 * blockIdx.y, so any number of rows fits the grid. */
#define QT_TILE 32
#define QT_ROWS 8
__global__ void cast_transpose_fp8_region_kernel(uint8_t *codes, uint8_t *codes_t,
                                                 float *amax_out, const float *__restrict__ x,
                                                 int rows, int cols, int r_begin, int r_end,
                                                 int c_begin, int c_end, fp8_format fmt,
                                                 const float *scale_p, int gelu,
                                                 const float *__restrict__ gbias) {
    __shared__ uint8_t tile[QT_TILE][QT_TILE + 4];
    const float scale = *scale_p;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int c0 = c_begin + blockIdx.x * QT_TILE;
    unsigned m = 0;
    /* 64-bit loop counter: r0 + the grid stride may pass INT_MAX on the last step */
    for (long long rl = r_begin + (long long)blockIdx.y * QT_TILE; rl < r_end;
         rl += (long long)gridDim.y * QT_TILE) {
        const int r0 = (int)rl;
#pragma unroll
        for (int i = 0; i < QT_TILE / QT_ROWS; i++) {
            int r = r0 + ty + i * QT_ROWS, c = c0 + tx;
            if (r < r_end && c < c_end) {
                float v = x[(size_t)r * cols + c];
                if (gelu) v = gelu_dev(gbias ? v + gbias[c] : v);
                m = max(m, abs_bits_dev(v));
                uint8_t code = fp8_enc_dev(v * scale, fmt);
                if (codes) codes[(size_t)r * cols + c] = code;
                tile[ty + i * QT_ROWS][tx] = code;
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < QT_TILE / QT_ROWS; i++) {
            int c = c0 + ty + i * QT_ROWS, r = r0 + tx; /* codes_t[c][r] = codes[r][c] */
            if (r < r_end && c < c_end)
                codes_t[(size_t)c * rows + r] = tile[tx][ty + i * QT_ROWS];
        }
        __syncthreads(); /* the tile is rewritten by the next iteration */
    }
    if (amax_out) {
        /* block_amax_bits_merge wants a 1-D block: the same steps on the linear index */
        __shared__ unsigned sh_m[QT_TILE * QT_ROWS / 32];
        int lin = ty * QT_TILE + tx;
        m = __reduce_max_sync(0xffffffffu, m);
        if ((lin & 31) == 0) sh_m[lin >> 5] = m;
        __syncthreads();
        if (lin == 0) {
            for (int w = 1; w < QT_TILE * QT_ROWS / 32; w++) m = max(m, sh_m[w]);
            atomic_amax_merge(amax_out, __uint_as_float(m > 0x7f800000u ? 0x7fc00000u : m));
        }
    }
}

/* Plain transpose of byte matrices: in [rows, cols] -> out [cols, rows]. */
__global__ void transpose_u8_kernel(uint8_t *out, const uint8_t *__restrict__ in, int rows,
                                    int cols) {
    __shared__ uint8_t tile[QT_TILE][QT_TILE + 4];
    int c0 = blockIdx.x * QT_TILE, r0 = blockIdx.y * QT_TILE;
    int tx = threadIdx.x, ty = threadIdx.y;
#pragma unroll
    for (int i = 0; i < QT_TILE / QT_ROWS; i++) {
        int r = r0 + ty + i * QT_ROWS, c = c0 + tx;
        if (r < rows && c < cols) tile[ty + i * QT_ROWS][tx] = in[(size_t)r * cols + c];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < QT_TILE / QT_ROWS; i++) {
        int c = c0 + ty + i * QT_ROWS, r = r0 + tx;
        if (r < rows && c < cols) out[(size_t)c * rows + r] = tile[tx][ty + i * QT_ROWS];
    }
}

void cuda_transpose_u8(fp8t_backend *b, uint8_t *out, const uint8_t *in, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    cuda_state *s = cuda_of(b);
    dim3 grid(cdiv_u(cols, QT_TILE), cdiv_u(rows, QT_TILE)), block(QT_TILE, QT_ROWS);
    transpose_u8_kernel<<<grid, block, 0, s->stream>>>(out, in, rows, cols);
    CUDA_LAUNCH_CHECK(s);
}

static void launch_region(cuda_state *s, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                          const float *x, int rows, int cols, int r_begin, int r_end, int c_begin,
                          int c_end, fp8_format fmt, const float *scale, int gelu = 0,
                          const float *gbias = NULL) {
    if (r_end <= r_begin || c_end <= c_begin) return;
    unsigned tiles_r = cdiv_u((size_t)(r_end - r_begin), QT_TILE);
    dim3 grid(cdiv_u((size_t)(c_end - c_begin), QT_TILE), tiles_r < 65535u ? tiles_r : 65535u);
    dim3 block(QT_TILE, QT_ROWS);
    cast_transpose_fp8_region_kernel<<<grid, block, 0, s->stream>>>(
        codes, codes_t, amax_out, x, rows, cols, r_begin, r_end, c_begin, c_end, fmt, scale, gelu,
        gbias);
    CUDA_LAUNCH_CHECK(s);
}

void cuda_quantize(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                   const float *x, int rows, int cols, fp8_format fmt, const float *scale) {
    if (rows <= 0 || cols <= 0) return;
    cuda_state *s = cuda_of(b);
    size_t n = (size_t)rows * cols;
    if (s->plain) {
        /* separate kernels: row-major codes (+ amax) in one pass, then the transpose of the
         * codes (through scratch when only codes_t is wanted) */
        uint8_t *rm = codes;
        if (!rm && codes_t) rm = (uint8_t *)cuda_scratch(b, SCR_QUANT, n);
        int vec = aligned16(x) && (!rm || aligned16(rm)) ? 1 : 0;
        cast_fp8_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(rm, amax_out, x, n, fmt,
                                                                          scale, vec);
        CUDA_LAUNCH_CHECK(s);
        if (codes_t) cuda_transpose_u8(b, codes_t, rm, rows, cols);
        return;
    }
    if (!codes && !codes_t && !amax_out) return; /* nothing asked for */
    if (!codes_t) {
        if (aligned16(x) && (!codes || aligned4(codes))) {
            size_t blocks =
                (n / 4 + CAST_THREADS * CAST_UNROLL - 1) / (CAST_THREADS * CAST_UNROLL);
            unsigned grid = (unsigned)(blocks > 0 ? blocks : 1);
            if (fmt == FP8_E4M3)
                cast_fp8_vec_kernel<FP8_E4M3, false><<<grid, CAST_THREADS, 0, s->stream>>>(
                    codes, amax_out, x, n, scale, NULL, cols, NULL);
            else
                cast_fp8_vec_kernel<FP8_E5M2, false><<<grid, CAST_THREADS, 0, s->stream>>>(
                    codes, amax_out, x, n, scale, NULL, cols, NULL);
        } else {
            cast_fp8_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(codes, amax_out, x,
                                                                              n, fmt, scale, 0);
        }
        CUDA_LAUNCH_CHECK(s);
        return;
    }
    /* full 64x64 tiles through the tiled kernel, the right and bottom edges through the
     * generic one (each element is in exactly one launch, so each code is written once) */
    int rows_f = rows / QT2_R * QT2_R, cols_f = cols / QT2_C * QT2_C;
    int tiled_ok = cols % 4 == 0 && rows % 16 == 0 && aligned16(x) && aligned16(codes_t) &&
                   (!codes || aligned4(codes)) && rows_f > 0 && cols_f > 0;
    if (!tiled_ok) {
        launch_region(s, codes, codes_t, amax_out, x, rows, cols, 0, rows, 0, cols, fmt, scale);
        return;
    }
    int tiles_c = cols_f / QT2_C;
    unsigned tiles = (unsigned)((size_t)(rows_f / QT2_R) * tiles_c);
    if (fmt == FP8_E4M3)
        cast_transpose_fp8_tiled_kernel<FP8_E4M3, false, false, false>
            <<<tiles, QT2_THREADS, 0, s->stream>>>(codes, codes_t, amax_out, x, rows, cols,
                                                   tiles_c, scale, NULL, NULL, NULL, NULL, NULL);
    else
        cast_transpose_fp8_tiled_kernel<FP8_E5M2, false, false, false>
            <<<tiles, QT2_THREADS, 0, s->stream>>>(codes, codes_t, amax_out, x, rows, cols,
                                                   tiles_c, scale, NULL, NULL, NULL, NULL, NULL);
    CUDA_LAUNCH_CHECK(s);
    launch_region(s, codes, codes_t, amax_out, x, rows, cols, 0, rows_f, cols_f, cols, fmt,
                  scale);
    launch_region(s, codes, codes_t, amax_out, x, rows, cols, rows_f, rows, 0, cols, fmt, scale);
}

/* y = gelu(x (+ bias)) (gelu_dev, as bias_add then gelu_forward): quantize_gelu's unfused
 * path */
__global__ void gelu_scratch_kernel(float *y, const float *__restrict__ x,
                                    const float *__restrict__ bias, int cols, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = gelu_dev(bias ? x[i] + bias[i % (size_t)cols] : x[i]);
}

/* quantize(gelu(x)) in one pass where the cast-transpose kernels run (codes_t wanted, the fused
 * path): they apply GELU to what they load. Otherwise (plain, or only row-major codes wanted)
 * GELU's output goes through scratch and cuda_quantize, which gives the same codes. */
void cuda_quantize_gelu(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                        uint16_t *save16, const float *x, const float *bias, int rows, int cols,
                        fp8_format fmt, const float *scale, float *values) {
    if (rows <= 0 || cols <= 0) return;
    cuda_state *s = cuda_of(b);
    size_t n = (size_t)rows * cols;
    if (!s->plain && !codes_t && !values && aligned16(x) && (!codes || aligned4(codes)) &&
        ((!bias && !save16) || (cols % 4 == 0 && aligned16(bias) && aligned8(save16)))) {
        /* row-major codes only (a frozen forward's, the inference model's): one elementwise
         * pass applying the bias and GELU to what it loads */
        const size_t blocks =
            (n / 4 + CAST_THREADS * CAST_UNROLL - 1) / (CAST_THREADS * CAST_UNROLL);
        const unsigned grid = (unsigned)(blocks > 0 ? blocks : 1);
        if (fmt == FP8_E4M3)
            cast_fp8_vec_kernel<FP8_E4M3, true><<<grid, CAST_THREADS, 0, s->stream>>>(
                codes, amax_out, x, n, scale, bias, cols, save16);
        else
            cast_fp8_vec_kernel<FP8_E5M2, true><<<grid, CAST_THREADS, 0, s->stream>>>(
                codes, amax_out, x, n, scale, bias, cols, save16);
        CUDA_LAUNCH_CHECK(s);
        return;
    }
    int rows_f = rows / QT2_R * QT2_R, cols_f = cols / QT2_C * QT2_C;
    /* GELU's FP32 output as well: from the tiled kernel where its tiles cover x */
    const int tiled_ok = !s->plain && codes_t && cols % 4 == 0 && rows % 16 == 0 &&
                         aligned16(x) && aligned16(codes_t) && (!codes || aligned4(codes)) &&
                         rows_f > 0 && cols_f > 0 && (!bias || aligned16(bias)) &&
                         (!values || (rows_f == rows && cols_f == cols && aligned16(values)));
    /* GELU's BF16 copy from the tiled kernel where its tiles cover x, else by bf16_pack */
    if (save16 && !(tiled_ok && rows_f == rows && cols_f == cols && aligned8(save16))) {
        cuda_bf16_pack(b, save16, x, bias, rows, cols);
        save16 = NULL;
    }
    if (s->plain || !codes_t || (values && !tiled_ok)) {
        float *y = values ? values : (float *)cuda_scratch(b, SCR_ACT, n * sizeof(float));
        gelu_scratch_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(y, x, bias, cols,
                                                                              n);
        CUDA_LAUNCH_CHECK(s);
        cuda_quantize(b, codes, codes_t, amax_out, y, rows, cols, fmt, scale);
        return;
    }
    if (!tiled_ok) {
        launch_region(s, codes, codes_t, amax_out, x, rows, cols, 0, rows, 0, cols, fmt, scale, 1,
                      bias);
        return;
    }
    int tiles_c = cols_f / QT2_C;
    unsigned tiles = (unsigned)((size_t)(rows_f / QT2_R) * tiles_c);
    if (fmt == FP8_E4M3)
        cast_transpose_fp8_tiled_kernel<FP8_E4M3, true, false, false>
            <<<tiles, QT2_THREADS, 0, s->stream>>>(codes, codes_t, amax_out, x, rows, cols,
                                                   tiles_c, scale, NULL, bias, NULL, NULL, save16,
                                                   NULL, NULL, NULL, values);
    else
        cast_transpose_fp8_tiled_kernel<FP8_E5M2, true, false, false>
            <<<tiles, QT2_THREADS, 0, s->stream>>>(codes, codes_t, amax_out, x, rows, cols,
                                                   tiles_c, scale, NULL, bias, NULL, NULL, save16,
                                                   NULL, NULL, NULL, values);
    CUDA_LAUNCH_CHECK(s);
    launch_region(s, codes, codes_t, amax_out, x, rows, cols, 0, rows_f, cols_f, cols, fmt, scale,
                  1, bias);
    launch_region(s, codes, codes_t, amax_out, x, rows, cols, rows_f, rows, 0, cols, fmt, scale,
                  1, bias);
}

/* quantize + column sums of x (the Dgrad's dY: its bias gradient) from the same read, where
 * the whole matrix is 64x64 tiles (the model's shapes): the tiled kernel writes per-tile column
 * partials, cuda_column_sums_finish adds them in tile order. Other shapes and plain: quantize,
 * then cuda_column_sums. */
void cuda_quantize_colsum(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t, float *amax_out,
                          float *colsum, const float *x, int rows, int cols, fp8_format fmt,
                          const float *scale) {
    if (rows <= 0 || cols <= 0) return;
    cuda_state *s = cuda_of(b);
    int whole = !s->plain && codes_t && rows % QT2_R == 0 && cols % QT2_C == 0 && aligned16(x) &&
                aligned16(codes_t) && (!codes || aligned4(codes));
    if (!whole) {
        cuda_quantize(b, codes, codes_t, amax_out, x, rows, cols, fmt, scale);
        cuda_column_sums(b, colsum, x, rows, cols);
        return;
    }
    int tiles_r = rows / QT2_R, tiles_c = cols / QT2_C;
    float *part = (float *)cuda_scratch(b, SCR_COLSUM, (size_t)tiles_r * cols * sizeof(float));
    unsigned tiles = (unsigned)((size_t)tiles_r * tiles_c);
    if (fmt == FP8_E4M3)
        cast_transpose_fp8_tiled_kernel<FP8_E4M3, false, true, false>
            <<<tiles, QT2_THREADS, 0, s->stream>>>(codes, codes_t, amax_out, x, rows, cols,
                                                   tiles_c, scale, part, NULL, NULL, NULL, NULL);
    else
        cast_transpose_fp8_tiled_kernel<FP8_E5M2, false, true, false>
            <<<tiles, QT2_THREADS, 0, s->stream>>>(codes, codes_t, amax_out, x, rows, cols,
                                                   tiles_c, scale, part, NULL, NULL, NULL, NULL);
    CUDA_LAUNCH_CHECK(s);
    cuda_column_sums_finish(b, colsum, part, tiles_r, cols);
}

/* quantize_colsum of gelu_grad(x (+ bias), dout) in one pass where quantize_colsum's tiled
 * kernel runs (it applies the GELU backward to what it loads); otherwise dx goes through scratch
 * (the unfused ops' bits) and quantize_colsum. */
void cuda_gelu_backward_quantize_colsum(fp8t_backend *b, uint8_t *codes, uint8_t *codes_t,
                                        float *amax_out, float *colsum, const float *dout,
                                        const float *x, const uint16_t *x16, const float *bias,
                                        int rows, int cols, fp8_format fmt, const float *scale,
                                        float *values) {
    if (rows <= 0 || cols <= 0) return;
    cuda_state *s = cuda_of(b);
    int whole = !s->plain && codes_t && rows % QT2_R == 0 && cols % QT2_C == 0 &&
                aligned16(dout) && aligned16(x) && (!bias || aligned16(bias)) &&
                aligned16(codes_t) && (!codes || aligned4(codes)) && aligned16(x16) &&
                aligned16(values);
    if (!whole) { /* dx into the request's values, or scratch */
        x = cuda_bf16_widen(b, SCR_GELU_X, x, x16, (size_t)rows * cols);
        float *dx = values
                        ? values
                        : (float *)cuda_scratch(b, SCR_ACT, (size_t)rows * cols * sizeof(float));
        if (bias)
            cuda_gelu_backward_bias(b, dx, x, bias, dout, rows, cols);
        else
            cuda_gelu_backward(b, dx, x, dout, (size_t)rows * cols);
        if (colsum)
            cuda_quantize_colsum(b, codes, codes_t, amax_out, colsum, dx, rows, cols, fmt, scale);
        else
            cuda_quantize(b, codes, codes_t, amax_out, dx, rows, cols, fmt, scale);
        return;
    }
    int tiles_r = rows / QT2_R, tiles_c = cols / QT2_C;
    float *part = (float *)cuda_scratch(b, SCR_COLSUM, (size_t)tiles_r * cols * sizeof(float));
    unsigned tiles = (unsigned)((size_t)tiles_r * tiles_c);
    if (fmt == FP8_E4M3)
        cast_transpose_fp8_tiled_kernel<FP8_E4M3, false, true, true>
            <<<tiles, QT2_THREADS, 0, s->stream>>>(codes, codes_t, amax_out, dout, rows, cols,
                                                   tiles_c, scale, part, bias, x, x16, NULL, NULL,
                                                   NULL, NULL, values);
    else
        cast_transpose_fp8_tiled_kernel<FP8_E5M2, false, true, true>
            <<<tiles, QT2_THREADS, 0, s->stream>>>(codes, codes_t, amax_out, dout, rows, cols,
                                                   tiles_c, scale, part, bias, x, x16, NULL, NULL,
                                                   NULL, NULL, values);
    CUDA_LAUNCH_CHECK(s);
    if (colsum) cuda_column_sums_finish(b, colsum, part, tiles_r, cols);
}

/* quantize_swiglu: per-tensor FP8 codes (codes_t optional) of SwiGLU's step r->step applied to
 * what the cast kernels load (swiglu_step4), amax and the saves from the same pass: the tiled
 * kernel where codes_t is wanted and the matrix is whole 64x64 tiles, the elementwise one for
 * the row-major codes alone; otherwise (plain, other shapes or alignments) the step's op into
 * scratch, then cuda_quantize, which gives the same bits. */
template <int SW>
static void launch_swiglu_cast(cuda_state *s, const fp8t_operand_req *r, const swiglu_in &in,
                               int tiled) {
    const fp8t_operand *o = &r->out;
    const int rows = o->rows, cols = o->cols;
    const size_t n = (size_t)rows * cols;
    uint8_t *codes = (uint8_t *)o->data, *codes_t = (uint8_t *)o->data_t;
    const int e4 = o->format == FP8T_OPERAND_E4M3;
    if (tiled) {
        const int tiles_c = cols / QT2_C;
        const unsigned tiles = (unsigned)((size_t)(rows / QT2_R) * tiles_c);
        if (e4)
            cast_transpose_fp8_tiled_kernel<FP8_E4M3, false, false, false, SW>
                <<<tiles, QT2_THREADS, 0, s->stream>>>(
                    codes, codes_t, o->amax, r->x, rows, cols, tiles_c, o->scale, NULL, NULL,
                    in.gate, in.gate16, in.save16, in.up, in.up16, in.save16b);
        else
            cast_transpose_fp8_tiled_kernel<FP8_E5M2, false, false, false, SW>
                <<<tiles, QT2_THREADS, 0, s->stream>>>(
                    codes, codes_t, o->amax, r->x, rows, cols, tiles_c, o->scale, NULL, NULL,
                    in.gate, in.gate16, in.save16, in.up, in.up16, in.save16b);
    } else {
        const size_t blocks =
            (n / 4 + CAST_THREADS * CAST_UNROLL - 1) / (CAST_THREADS * CAST_UNROLL);
        const unsigned grid = (unsigned)(blocks > 0 ? blocks : 1);
        if (e4)
            cast_fp8_vec_kernel<FP8_E4M3, false, SW><<<grid, CAST_THREADS, 0, s->stream>>>(
                codes, o->amax, r->x, n, o->scale, NULL, cols, in.save16, in.gate, in.gate16,
                in.up, in.up16, in.save16b);
        else
            cast_fp8_vec_kernel<FP8_E5M2, false, SW><<<grid, CAST_THREADS, 0, s->stream>>>(
                codes, o->amax, r->x, n, o->scale, NULL, cols, in.save16, in.gate, in.gate16,
                in.up, in.up16, in.save16b);
    }
    CUDA_LAUNCH_CHECK(s);
}

void cuda_quantize_swiglu(fp8t_backend *b, const fp8t_operand_req *r) {
    const fp8t_operand *o = &r->out;
    const int rows = o->rows, cols = o->cols;
    if (rows <= 0 || cols <= 0) return;
    cuda_state *s = cuda_of(b);
    uint8_t *codes = (uint8_t *)o->data, *codes_t = (uint8_t *)o->data_t;
    const swiglu_in in = swiglu_in_of(r);
    const int tiled = codes_t && rows % QT2_R == 0 && cols % QT2_C == 0 && aligned16(codes_t);
    if (!s->plain && cols % 4 == 0 && swiglu_in_aligned(&in, r->x) && aligned4(codes) &&
        (tiled || !codes_t)) {
        with_sw(in.sw,
                [&](auto sw) { launch_swiglu_cast<decltype(sw)::value>(s, r, in, tiled); });
        return;
    }
    cuda_quantize(b, codes, codes_t, o->amax, cuda_swiglu_values(b, r), rows, cols,
                  (fp8_format)o->format, o->scale);
}

/* ---------------------------------------------------------------------------------------- */
/* scales */

__global__ void compute_scale_kernel(float *scale, float *scale_inv, const float *amax,
                                     float fmt_max, float epsilon, int pow2) {
    float sc = current_scale_dev(*amax, fmt_max, epsilon, pow2);
    *scale = sc;
    *scale_inv = 1.0f / sc;
}

void cuda_compute_scale(fp8t_backend *b, float *scale, float *scale_inv, const float *amax,
                        float fmt_max, float epsilon, int pow2) {
    cuda_state *s = cuda_of(b);
    compute_scale_kernel<<<1, 1, 0, s->stream>>>(scale, scale_inv, amax, fmt_max, epsilon, pow2);
    CUDA_LAUNCH_CHECK(s);
}

/* Delayed-scaling update (recipe.h), one thread per tensor over its history column. The
 * history is [len][n], so neighbouring threads touch neighbouring floats. */
__global__ void delayed_update_kernel(float *state, int n, int len, int algo, int margin) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    float *hist = state;
    float *scale = state + (size_t)len * n;
    float *scale_inv = scale + n;
    const float *fmt_max = scale_inv + n;
    float amax;
    if (algo == FP8T_AMAX_MOST_RECENT) {
        amax = hist[t];
    } else {
        /* fmaxf skips a NaN slot, as fp8t_history_max and Transformer Engine do */
        amax = 0.0f;
        for (int i = 0; i < len; i++) amax = fmaxf(amax, hist[(size_t)i * n + t]);
    }
    /* fp8t_delayed_scale: amax 0, negative, Inf or NaN keeps the previous scale */
    float sc = scale[t];
    if (amax > 0.0f && !isinf(amax)) {
        sc = (fmt_max[t] / amax) / ldexpf(1.0f, margin);
        if (isinf(sc)) sc = 3.402823466e38f; /* FLT_MAX */
    }
    scale[t] = sc;
    scale_inv[t] = 1.0f / sc;
    /* roll: new[i] = old[i+1], new[len-1] = old[0], then new[0] = 0 */
    float first = hist[t];
    for (int i = 0; i + 1 < len; i++) hist[(size_t)i * n + t] = hist[(size_t)(i + 1) * n + t];
    hist[(size_t)(len - 1) * n + t] = first;
    hist[t] = 0.0f;
}

void cuda_delayed_update(fp8t_backend *b, float *state, int n, int len, fp8t_amax_algo algo,
                         int margin) {
    if (n <= 0 || len <= 0) return;
    cuda_state *s = cuda_of(b);
    delayed_update_kernel<<<cdiv_u(n, 128), 128, 0, s->stream>>>(state, n, len, (int)algo,
                                                                 margin);
    CUDA_LAUNCH_CHECK(s);
}

/* ---------------------------------------------------------------------------------------- */
/* fake quantization and rounding (elementwise; out may alias x) */

__global__ void fake_quantize_kernel(float *out, const float *x, size_t n, fp8_format fmt,
                                     const float *scale_p) {
    float scale = *scale_p;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = fp8_dec_dev(fp8_enc_dev(x[i] * scale, fmt), fmt) / scale;
}

void cuda_fake_quantize(fp8t_backend *b, float *out, const float *x, size_t n, fp8_format fmt,
                        const float *scale) {
    if (n == 0) return;
    cuda_state *s = cuda_of(b);
    fake_quantize_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(out, x, n, fmt, scale);
    CUDA_LAUNCH_CHECK(s);
}

__global__ void bf16_round_kernel(float *out, const float *x, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = bf16_round_dev(x[i]);
}

void cuda_bf16_round(fp8t_backend *b, float *out, const float *x, size_t n) {
    if (n == 0) return;
    cuda_state *s = cuda_of(b);
    bf16_round_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(out, x, n);
    CUDA_LAUNCH_CHECK(s);
}

__global__ void fp8_decode_kernel(float *out, const uint8_t *__restrict__ codes, size_t n,
                                  fp8_format fmt, const float *scale_inv_p) {
    float si = *scale_inv_p;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = fp8_dec_dev(codes[i], fmt) * si;
}

void cuda_fp8_decode(fp8t_backend *b, float *out, const uint8_t *codes, size_t n, fp8_format fmt,
                     const float *scale_inv) {
    if (n == 0) return;
    cuda_state *s = cuda_of(b);
    fp8_decode_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(out, codes, n, fmt,
                                                                        scale_inv);
    CUDA_LAUNCH_CHECK(s);
}

/* ---------------------------------------------------------------------------------------- */
/* block scaling: one thread block per tile_r x tile_c block (edge blocks partial). Pass 1:
 * the block's amax; pass 2: quantize with the current-scaling scale of that amax and
 * dequantize. Reads of pass 2 hit L1/L2 (a 128x128 tile is 64 KiB). */
__global__ void block_fake_quantize_kernel(float *out, const float *x, int rows, int cols,
                                           int tile_r, int tile_c, fp8_format fmt,
                                           float fmt_max) {
    int nbc = (cols + tile_c - 1) / tile_c;
    int br = (int)(blockIdx.x / nbc), bc = (int)(blockIdx.x % nbc);
    int r0 = br * tile_r, c0 = bc * tile_c;
    int nr = min(tile_r, rows - r0), nc = min(tile_c, cols - c0);
    int cnt = nr * nc;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < cnt; i += blockDim.x) {
        int r = r0 + i / nc, c = c0 + i % nc;
        acc = amax_merge_dev(acc, x[(size_t)r * cols + c]);
    }
    acc = block_amax(acc);
    __shared__ float sh_scale;
    if (threadIdx.x == 0) sh_scale = current_scale_dev(acc, fmt_max, 0.0f, 0);
    __syncthreads();
    float scale = sh_scale;
    for (int i = threadIdx.x; i < cnt; i += blockDim.x) {
        int r = r0 + i / nc, c = c0 + i % nc;
        size_t k = (size_t)r * cols + c;
        out[k] = fp8_dec_dev(fp8_enc_dev(x[k] * scale, fmt), fmt) / scale;
    }
}

void cuda_block_fake_quantize(fp8t_backend *b, float *out, const float *x, int rows, int cols,
                              int tile_r, int tile_c, fp8_format fmt) {
    if (rows <= 0 || cols <= 0) return;
    if (tile_r <= 0 || tile_c <= 0) {
        FP8T_FATAL("block_fake_quantize: tile %dx%d must be positive", tile_r, tile_c);
    }
    cuda_state *s = cuda_of(b);
    /* 1-D grid over blocks (row-major), so any number of block rows fits */
    unsigned grid = cdiv_u(cols, tile_c) * cdiv_u(rows, tile_r);
    float fmt_max = fmt == FP8_E4M3 ? FP8_E4M3_MAX : FP8_E5M2_MAX;
    int threads = tile_r * tile_c >= 1024 ? 256 : 128;
    block_fake_quantize_kernel<<<grid, threads, 0, s->stream>>>(out, x, rows, cols, tile_r,
                                                                tile_c, fmt, fmt_max);
    CUDA_LAUNCH_CHECK(s);
}

/* block_quantize of 128x128 blocks (the weight; the 1x128 cases have the two kernels below):
 * one thread block per block of the operand [R, K] (x, or xᵀ with transpose: operand element
 * (r, k) is x[k, r]). Pass 1: the block's amax; pass 2: codes with the current-scaling scale
 * of that amax; thread 0 stores scale_inv = 1 / scale at the block's place in the operand
 * layout (fp8t_block_scale_index). The same encoder and scale formula as
 * block_fake_quantize_kernel, so codes and scales are the CPU's. Reads go along x's rows;
 * with transpose the codes are staged in shared memory and written along the operand's rows. */
__global__ void block_quantize_kernel(uint8_t *codes, float *scale_inv, const float *x, int rows,
                                      int cols, int transpose, fp8_format fmt, float fmt_max,
                                      int pow2) {
    __shared__ uint8_t sh[128][132]; /* [operand row][k] of the block, transpose only */
    const int R = transpose ? cols : rows, K = transpose ? rows : cols;
    const int nbk = (K + 127) / 128;
    const int br = (int)(blockIdx.x / nbk), bk = (int)(blockIdx.x % nbk);
    const int r0 = br * 128, k0 = bk * 128;
    const int nr = min(128, R - r0), nk = min(128, K - k0);
    /* the block as x stores it: xr rows of xc columns from (xr0, xc0) */
    const int xr0 = transpose ? k0 : r0, xc0 = transpose ? r0 : k0;
    const int xr = transpose ? nk : nr, xc = transpose ? nr : nk;
    const int cnt = xr * xc;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < cnt; i += blockDim.x)
        acc = amax_merge_dev(acc, x[(size_t)(xr0 + i / xc) * cols + xc0 + i % xc]);
    acc = block_amax(acc);
    __shared__ float sh_scale;
    if (threadIdx.x == 0) {
        float sc = current_scale_dev(acc, fmt_max, 0.0f, pow2);
        sh_scale = sc;
        scale_inv[fp8t_block_scale_index(FP8T_SCALING_BLK128, R, K, r0, k0)] = 1.0f / sc;
    }
    __syncthreads();
    const float scale = sh_scale;
    for (int i = threadIdx.x; i < cnt; i += blockDim.x) {
        const int a = i / xc, b = i % xc; /* x element (xr0 + a, xc0 + b) */
        const uint8_t q = fp8_enc_dev(x[(size_t)(xr0 + a) * cols + xc0 + b] * scale, fmt);
        if (transpose)
            sh[b][a] = q; /* operand (r0 + b, k0 + a) */
        else
            codes[(size_t)(r0 + a) * K + k0 + b] = q;
    }
    if (!transpose) return;
    __syncthreads();
    for (int i = threadIdx.x; i < nr * nk; i += blockDim.x) {
        const int rl = i / nk, kl = i % nk;
        codes[(size_t)(r0 + rl) * K + k0 + kl] = sh[rl][kl];
    }
}

/* 1x128 tiles along x's rows (the Fprop's X, the Dgrad's dY): a warp per tile, each lane 4
 * elements 32 apart (coalesced), the amax by warp_amax (the same max in another order). */
__global__ void block_quantize_rows_kernel(uint8_t *codes, float *scale_inv, const float *x,
                                           int rows, int cols, fp8_format fmt, float fmt_max,
                                           int pow2) {
    const int nbk = (cols + 127) / 128;
    const size_t tile = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (tile >= (size_t)rows * nbk) return; /* whole warps leave together */
    const int r = (int)(tile / nbk), k0 = (int)(tile % nbk) * 128;
    const float *xr = x + (size_t)r * cols;
    float v[4], acc = 0.0f;
    for (int j = 0; j < 4; j++) {
        const int k = k0 + lane + 32 * j;
        v[j] = k < cols ? xr[k] : 0.0f;
        if (k < cols) acc = amax_merge_dev(acc, v[j]);
    }
    acc = warp_amax(acc);
    const float sc = current_scale_dev(acc, fmt_max, 0.0f, pow2);
    if (lane == 0)
        scale_inv[fp8t_block_scale_index(FP8T_SCALING_VEC128, rows, cols, r, k0)] = 1.0f / sc;
    uint8_t *out = codes + (size_t)r * cols;
    for (int j = 0; j < 4; j++) {
        const int k = k0 + lane + 32 * j;
        if (k < cols) out[k] = fp8_enc_dev(v[j] * sc, fmt);
    }
}

/* The Wgrad's case, 1x128 tiles of xᵀ (128 rows of one column of x), coalesced: a thread block
 * takes 32 columns x 128 rows of x into shared memory (each warp reading whole row segments),
 * reduces each column's amax (the same max, NaN winning, in another order: the same value),
 * and writes each operand row's 128 codes as one contiguous run. 256 threads. */
__global__ void block_quantize_t_kernel(uint8_t *codes, float *scale_inv, const float *x,
                                        int rows, int cols, fp8_format fmt, float fmt_max,
                                        int pow2) {
    __shared__ float tile[128][33];
    __shared__ float part[8][32];
    __shared__ float sh_scale[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c0 = blockIdx.x * 32, k0 = blockIdx.y * 128; /* x column, x row */
    const int c = c0 + lane;
    float acc = 0.0f;
    for (int i = warp; i < 128; i += 8) {
        const int k = k0 + i;
        float v = 0.0f;
        if (c < cols && k < rows) {
            v = x[(size_t)k * cols + c];
            acc = amax_merge_dev(acc, v);
        }
        tile[i][lane] = v;
    }
    part[warp][lane] = acc;
    __syncthreads();
    if (warp == 0) {
        float a = 0.0f;
        for (int w = 0; w < 8; w++) a = amax_merge_dev(a, part[w][lane]);
        float sc = current_scale_dev(a, fmt_max, 0.0f, pow2);
        sh_scale[lane] = sc;
        if (c < cols) /* operand [R = cols, K = rows], row c, tile k0 / 128 */
            scale_inv[fp8t_block_scale_index(FP8T_SCALING_VEC128, cols, rows, c, k0)] = 1.0f / sc;
    }
    __syncthreads();
    const int nk = min(128, rows - k0);
    for (int j = warp; j < 32; j += 8) { /* operand row c0 + j */
        if (c0 + j >= cols) break;
        const float sc = sh_scale[j];
        uint8_t *out = codes + (size_t)(c0 + j) * rows + k0;
        for (int i = lane; i < nk; i += 32) out[i] = fp8_enc_dev(tile[i][j] * sc, fmt);
    }
}

void cuda_block_quantize(fp8t_backend *b, uint8_t *codes, float *scale_inv, const float *x,
                         int rows, int cols, int transpose, fp8t_fp8_scaling scaling,
                         fp8_format fmt, int pow2) {
    if (rows <= 0 || cols <= 0) return;
    if (scaling != FP8T_SCALING_VEC128 && scaling != FP8T_SCALING_BLK128 &&
        scaling != FP8T_SCALING_ROW) {
        FP8T_FATAL("block_quantize: scaling %d is not a block kind", (int)scaling);
    }
    if (scaling == FP8T_SCALING_ROW) {
        cuda_row_quantize_generic(b, codes, scale_inv, x, rows, cols, transpose, fmt, pow2);
        return;
    }
    cuda_state *s = cuda_of(b);
    const int R = transpose ? cols : rows, K = transpose ? rows : cols;
    float fmt_max = fmt == FP8_E4M3 ? FP8_E4M3_MAX : FP8_E5M2_MAX;
    if (transpose && scaling == FP8T_SCALING_VEC128) {
        dim3 grid_t(cdiv_u(cols, 32), cdiv_u(rows, 128));
        block_quantize_t_kernel<<<grid_t, 256, 0, s->stream>>>(codes, scale_inv, x, rows, cols,
                                                               fmt, fmt_max, pow2);
        CUDA_LAUNCH_CHECK(s);
        return;
    }
    if (scaling == FP8T_SCALING_VEC128) {
        size_t warps = (size_t)rows * cdiv_u(cols, 128);
        block_quantize_rows_kernel<<<cdiv_u(warps * 32, 256), 256, 0, s->stream>>>(
            codes, scale_inv, x, rows, cols, fmt, fmt_max, pow2);
        CUDA_LAUNCH_CHECK(s);
        return;
    }
    const unsigned grid = cdiv_u(K, 128) * cdiv_u(R, 128); /* 1-D over the blocks */
    block_quantize_kernel<<<grid, 256, 0, s->stream>>>(codes, scale_inv, x, rows, cols, transpose,
                                                       fmt, fmt_max, pow2);
    CUDA_LAUNCH_CHECK(s);
}

/* code * scale_inv of each element of a block-scaled [rows, K] operand (gemm_fp8's fallback) */
__global__ void block_decode_kernel(float *out, const uint8_t *__restrict__ codes,
                                    const float *__restrict__ scale_inv, int rows, int K,
                                    int scaling, fp8_format fmt) {
    size_t n = (size_t)rows * K;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / K), k = (int)(i % K);
        float si =
            scaling == FP8T_SCALING_TENSOR
                ? scale_inv[0]
                : scale_inv[fp8t_block_scale_index((fp8t_fp8_scaling)scaling, rows, K, r, k)];
        out[i] = fp8_dec_dev(codes[i], fmt) * si;
    }
}

void cuda_block_decode(fp8t_backend *b, float *out, const fp8t_fp8_operand *o) {
    size_t n = (size_t)o->rows * o->cols;
    if (n == 0) return;
    cuda_state *s = cuda_of(b);
    block_decode_kernel<<<ew_blocks(s, n, 1), EW_THREADS, 0, s->stream>>>(
        out, o->data, o->scale_inv, o->rows, o->cols, (int)o->scaling, o->fmt);
    CUDA_LAUNCH_CHECK(s);
}

/* MXFP8: a warp per 32-element row block, lane = element (the exponent: mx_biased_exponent,
 * cuda_common.cuh). */

__global__ void mxfp8_fake_quantize_kernel(float *out, const float *x, int rows, int cols) {
    int nblk = (cols + 31) / 32;
    size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= (size_t)rows * nblk) return; /* whole warps leave together */
    int r = (int)(warp / nblk), bk = (int)(warp % nblk);
    int c = bk * 32 + lane;
    size_t k = (size_t)r * cols + c;
    float v = c < cols ? x[k] : 0.0f;
    float a = warp_amax(amax_merge_dev(0.0f, v));
    int eb = mx_biased_exponent(a);
    if (c >= cols) return;
    if (eb == 0xFF) {
        out[k] = __int_as_float(0x7fc00000);
        return;
    }
    float inv = ldexpf(1.0f, 127 - eb); /* 2^-e, exact */
    uint8_t code = fp8_enc_dev(v * inv, FP8_E4M3);
    /* in double, so a result in the float subnormal range is rounded once (as the CPU) */
    out[k] = (float)((double)fp8_dec_dev(code, FP8_E4M3) * ldexp(1.0, eb - 127));
}

void cuda_mxfp8_fake_quantize(fp8t_backend *b, float *out, const float *x, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    cuda_state *s = cuda_of(b);
    size_t warps = (size_t)rows * ((cols + 31) / 32);
    mxfp8_fake_quantize_kernel<<<cdiv_u(warps * 32, 256), 256, 0, s->stream>>>(out, x, rows,
                                                                               cols);
    CUDA_LAUNCH_CHECK(s);
}

/* ---------------------------------------------------------------------------------------- */
/* quantize_scaled: both orientations of a block- or row-scaled operand from one read.
 *
 * One block of 512 threads per 128x128 tile of x (edge tiles partial). Thread (tx = tid % 32,
 * ty = tid / 32) holds the float4 at columns 4tx..4tx+3 of the tile's rows 8ty..8ty+7 in
 * registers (a warp load is one 512-byte row segment). 8 rows a thread, not 16, so that the
 * kernels fit 64 registers and an SM runs 2 blocks of 16 warps: with 16 rows (~120 registers,
 * 8 warps a block) the GELU and dGELU tiles were compute-bound at 1.2-1.5 TB/s on an H100,
 * 1.4x slower (dev/cuda/quantize_ladder.cu keeps that version). From the registers:
 *   row amaxes: a warp's 32 lanes hold a whole tile row, one __reduce_max_sync over the |x|
 *     bit patterns each (the order of the patterns is the order of the magnitudes, and every
 *     NaN pattern lies above +Inf's, so the max is a NaN pattern exactly when a NaN is there:
 *     the amax op's rule);
 *   column amaxes: each thread's 8 rows, then the 16 warps through shared memory;
 *   VEC128: a row's scale from its row amax (its 1x128 tile along x's cols), a column's from
 *     its column amax (its 1x128 tile along x's rows, the transposed operand's K); BLK128: one
 *     scale from the tile's amax for both; ROW: the scales from the whole-row / whole-column
 *     amaxes a first pass (scaled_amax_kernel) left in global memory;
 *   codes: a 4-byte store per row (a warp writes 128 contiguous bytes);
 *   codes_t: a thread's 8 rows of one column are 8 contiguous bytes of codes_t's row: one
 *     uint2 into a shared [128 columns][16 chunks] tile, chunk q of column c at slot
 *     q ^ ((c ^ c / 4) % 16), so that the 16 lanes of a store phase (16 columns) and of a read
 *     phase (one column's 16 chunks) hit 16 different slots; each column's 128 bytes then go
 *     out as 16 uint2 stores by 16 lanes (coalesced 128-byte rows).
 * The encoder is fp8_enc_dev's instruction, the scale formula current_scale_dev and
 * scale_inv = 1 / scale: the CPU's block_quantize bits. GELU (PRO 1) and the GELU backward
 * (PRO 2) are applied to what is loaded, with gelu_dev / gelu_grad as gelu_forward and
 * gelu_backward(_bias) evaluate them; SwiGLU (PRO 3, with the BF16 saves of gate and up from
 * the same read) and its gradients (PRO 4 the gate's, 5 up's) with swiglu_value / swiglu_grads
 * as swiglu_forward and swiglu_backward do (no bias, no column sums); COLSUM writes the
 * tile's column sums in a fixed order: each 16-row group row by row (the odd warp of a pair
 * continues the even warp's partial through shared memory), then the 8 groups in order, for
 * cuda_column_sums_finish. Needs rows % 16 == 0, cols % 4 == 0, x (gx, bias) 16-byte aligned,
 * codes 4-byte and codes_t 16-byte aligned. */
#define SQ_TILE 128
#define SQ_RPT 8                    /* tile rows per thread */
#define SQ_WARPS (SQ_TILE / SQ_RPT) /* 16 */
#define SQ_THREADS (32 * SQ_WARPS)  /* 512 */

enum { SQ_VEC = 1, SQ_BLK = 2, SQ_ROW = 3 };
enum { SQ_PLAIN = 0, SQ_GELU = 1, SQ_DGELU = 2, SQ_SWIGLU = 3, SQ_DGATE = 4, SQ_DUP = 5 };

typedef struct {
    uint8_t *codes, *codes_t;
    float *sinv, *sinv_t;
    float *amax_out;
    float *part; /* COLSUM: [tiles_r, cols] */
    const float *x, *gx, *bias;
    const uint16_t *gx16; /* DGELU: GELU's input as its BF16 copy (gx NULL, no bias) */
    uint16_t *save16;     /* GELU: GELU's input written as BF16 here too (bf16_pack's bits);
                             SWIGLU: the gate's (x) */
    uint16_t *save16_2;   /* SWIGLU: up's BF16 copy */
    const float *up;      /* SWIGLU, DGATE: up (DGATE: or NULL, up16) */
    const uint16_t *up16; /* DGATE: up as its BF16 save */
    /* DGATE, DUP: the gate is gx (or gx16), x the gradient of SwiGLU's output */
    unsigned *row_bits, *col_bits; /* ROW: |x| bit-pattern amaxes per row / column */
    int rows, cols, tiles_c;
    float fmt_max;
    int pow2;
} sq_args;

__device__ __forceinline__ float bits_amax(unsigned m) {
    return __uint_as_float(m > 0x7f800000u ? 0x7fc00000u : m);
}

/* the tile's float4s after the prologue: v[k] = columns 4tx.. of tile row 8ty + k (zeros
 * outside x) */
template <int PRO>
__device__ __forceinline__ void sq_load(float4 v[SQ_RPT], const sq_args &a, int r0, int c0,
                                        int tx, int ty) {
    const int c = c0 + 4 * tx;
    const bool col_ok = c < a.cols;
    float4 bb = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (PRO != SQ_PLAIN && a.bias && col_ok) bb = *(const float4 *)(a.bias + c);
#pragma unroll
    for (int k = 0; k < SQ_RPT; k++) {
        const int r = r0 + SQ_RPT * ty + k;
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
            } else if (PRO == SQ_SWIGLU) { /* x the gate */
                t = swiglu_step4<1>(t, e0, NULL, NULL, a.up, NULL, a.save16, a.save16_2);
            } else if (PRO == SQ_DGATE || PRO == SQ_DUP) { /* gx / gx16 the gate */
                constexpr int SW = PRO == SQ_DGATE ? 2 : 3;
                t = swiglu_step4<SW>(t, e0, a.gx, a.gx16, a.up, a.up16, NULL, NULL);
            }
        }
        v[k] = t;
    }
}

/* ROW's first pass: the amax of every row and column of the values, as |x| bit patterns
 * max-merged into row_bits / col_bits (atomicMax: order-independent), and the tensor amax. */
template <int PRO>
__global__ void __launch_bounds__(SQ_THREADS, 2) scaled_amax_kernel(sq_args a) {
    __shared__ unsigned sm_cm[SQ_WARPS][SQ_TILE];
    const int tid = threadIdx.x, tx = tid & 31, ty = tid >> 5;
    const int r0 = (int)(blockIdx.x / a.tiles_c) * SQ_TILE;
    const int c0 = (int)(blockIdx.x % a.tiles_c) * SQ_TILE;
    float4 v[SQ_RPT];
    sq_load<PRO>(v, a, r0, c0, tx, ty);
    unsigned cm[4] = {0u, 0u, 0u, 0u}, all = 0u;
#pragma unroll
    for (int k = 0; k < SQ_RPT; k++) {
        cm[0] = max(cm[0], abs_bits_dev(v[k].x));
        cm[1] = max(cm[1], abs_bits_dev(v[k].y));
        cm[2] = max(cm[2], abs_bits_dev(v[k].z));
        cm[3] = max(cm[3], abs_bits_dev(v[k].w));
        const unsigned rm = __reduce_max_sync(0xffffffffu, abs_bits4_dev(0u, v[k]));
        const int r = r0 + SQ_RPT * ty + k;
        if (tx == 0 && r < a.rows) atomicMax(a.row_bits + r, rm);
        all = max(all, rm);
    }
#pragma unroll
    for (int j = 0; j < 4; j++) sm_cm[ty][4 * tx + j] = cm[j];
    __syncthreads();
    if (tid < SQ_TILE && c0 + tid < a.cols) {
        unsigned m = 0u;
        for (int w = 0; w < SQ_WARPS; w++) m = max(m, sm_cm[w][tid]);
        atomicMax(a.col_bits + c0 + tid, m);
    }
    if (a.amax_out) block_amax_bits_merge(a.amax_out, all);
}

/* codes_t's staging slot of chunk (8 rows) `chunk` of tile column `col` (see the top) */
__device__ __forceinline__ int sq_t_slot(int col, int chunk) {
    return col * 16 + (chunk ^ ((col ^ (col >> 2)) & 15));
}

template <fp8_format FMT, int KIND, int PRO, bool COLSUM>
__global__ void __launch_bounds__(SQ_THREADS, 2) scaled_tile_kernel(sq_args a) {
    __shared__ uint2 sm_t[SQ_TILE * 16];          /* [column][16 chunks of 8 rows], swizzled */
    __shared__ unsigned sm_cm[SQ_WARPS][SQ_TILE]; /* column amax bits per warp */
    __shared__ float sm_cs[SQ_TILE];              /* column scales */
    __shared__ __align__(16) float sm_part[COLSUM ? SQ_WARPS / 2 : 1][SQ_TILE];
    const __nv_fp8_interpretation_t it = FMT == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2;
    const int tid = threadIdx.x, tx = tid & 31, ty = tid >> 5;
    const int tr = (int)(blockIdx.x / a.tiles_c), tcol = (int)(blockIdx.x % a.tiles_c);
    const int r0 = tr * SQ_TILE, c0 = tcol * SQ_TILE;
    const int nr = min(SQ_TILE, a.rows - r0), nc = min(SQ_TILE, a.cols - c0);
    float4 v[SQ_RPT];
    sq_load<PRO>(v, a, r0, c0, tx, ty);

    /* row amaxes (VEC, BLK) */
    unsigned rmax[SQ_RPT];
    unsigned all = 0u;
    if (KIND != SQ_ROW) {
#pragma unroll
        for (int k = 0; k < SQ_RPT; k++) {
            rmax[k] = __reduce_max_sync(0xffffffffu, abs_bits4_dev(0u, v[k]));
            all = max(all, rmax[k]);
        }
    }
    /* column scales into sm_cs */
    if (KIND == SQ_VEC) {
        unsigned cm[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int k = 0; k < SQ_RPT; k++) {
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
            for (int w = 0; w < SQ_WARPS; w++) m = max(m, sm_cm[w][tid]);
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
            for (int w = 0; w < SQ_WARPS; w++) m = max(m, sm_cm[0][w]);
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
    if (COLSUM && (ty & 1) == 0) {
        float4 cs = v[0];
#pragma unroll
        for (int k = 1; k < SQ_RPT; k++)
            cs = make_float4(cs.x + v[k].x, cs.y + v[k].y, cs.z + v[k].z, cs.w + v[k].w);
        *(float4 *)&sm_part[ty >> 1][4 * tx] = cs;
    }
    __syncthreads();
    if (COLSUM) {
        if (ty & 1) {
            float4 cs = *(const float4 *)&sm_part[ty >> 1][4 * tx];
#pragma unroll
            for (int k = 0; k < SQ_RPT; k++)
                cs = make_float4(cs.x + v[k].x, cs.y + v[k].y, cs.z + v[k].z, cs.w + v[k].w);
            *(float4 *)&sm_part[ty >> 1][4 * tx] = cs;
        }
        __syncthreads();
        if (tid < nc) {
            float t = sm_part[0][tid];
            for (int w = 1; w < SQ_WARPS / 2; w++) t += sm_part[w][tid];
            a.part[(size_t)tr * a.cols + c0 + tid] = t;
        }
    }

    const int c = c0 + 4 * tx;
    const bool col_ok = 4 * tx < nc;
    /* row-major codes with the row scales */
    if (a.codes) {
        const float sblk = KIND == SQ_BLK ? sm_cs[0] : 0.0f;
#pragma unroll
        for (int k = 0; k < SQ_RPT; k++) {
            const int rl = SQ_RPT * ty + k, r = r0 + rl;
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
    /* transposed codes with the column scales: column 4tx + j's 8 rows as one uint2 */
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float sc = sm_cs[KIND == SQ_BLK ? 0 : 4 * tx + j];
        uint32_t w[2];
#pragma unroll
        for (int q = 0; q < 2; q++) {
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
        sm_t[sq_t_slot(4 * tx + j, ty)] = make_uint2(w[0], w[1]);
    }
    __syncthreads();
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const int idx = tid + SQ_THREADS * p, cl = idx >> 4, k = idx & 15;
        if (cl < nc && 8 * k < nr)
            *(uint2 *)(a.codes_t + (size_t)(c0 + cl) * a.rows + r0 + 8 * k) =
                sm_t[sq_t_slot(cl, k)];
    }
    if (a.amax_out && KIND != SQ_ROW) block_amax_bits_merge(a.amax_out, all);
}

/* The whole-row scaled operand (ROW) for the fallback: one block per operand row (x's row, or
 * with transpose x's column), the amax over its K elements, then the codes. Any shape. */
__global__ void row_quantize_generic_kernel(uint8_t *codes, float *scale_inv, const float *x,
                                            int rows, int cols, int transpose, fp8_format fmt,
                                            float fmt_max, int pow2) {
    const int K = transpose ? rows : cols;
    const int r = blockIdx.x;
    float acc = 0.0f;
    for (int k = threadIdx.x; k < K; k += blockDim.x)
        acc = amax_merge_dev(acc, transpose ? x[(size_t)k * cols + r] : x[(size_t)r * cols + k]);
    acc = block_amax(acc);
    __shared__ float sh_sc;
    if (threadIdx.x == 0) {
        sh_sc = current_scale_dev(acc, fmt_max, 0.0f, pow2);
        scale_inv[r] = 1.0f / sh_sc;
    }
    __syncthreads();
    const float sc = sh_sc;
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        const float v = transpose ? x[(size_t)k * cols + r] : x[(size_t)r * cols + k];
        codes[(size_t)r * K + k] = fp8_enc_dev(v * sc, fmt);
    }
}

void cuda_row_quantize_generic(fp8t_backend *b, uint8_t *codes, float *scale_inv, const float *x,
                               int rows, int cols, int transpose, fp8_format fmt, int pow2) {
    cuda_state *s = cuda_of(b);
    const int R = transpose ? cols : rows;
    const float fmt_max = fmt == FP8_E4M3 ? FP8_E4M3_MAX : FP8_E5M2_MAX;
    row_quantize_generic_kernel<<<(unsigned)R, 256, 0, s->stream>>>(
        codes, scale_inv, x, rows, cols, transpose, fmt, fmt_max, pow2);
    CUDA_LAUNCH_CHECK(s);
}

template <fp8_format FMT, int KIND, int PRO>
static void launch_scaled_tiles(cuda_state *s, const sq_args &a, unsigned tiles, int colsum) {
    if (colsum)
        scaled_tile_kernel<FMT, KIND, PRO, true><<<tiles, SQ_THREADS, 0, s->stream>>>(a);
    else
        scaled_tile_kernel<FMT, KIND, PRO, false><<<tiles, SQ_THREADS, 0, s->stream>>>(a);
    CUDA_LAUNCH_CHECK(s);
}

/* f(std::integral_constant<int, PRO>()) for the runtime prologue pro: the one mapping of a
 * prologue to its kernel instantiation, for both passes */
template <class F> static void with_pro(int pro, F &&f) {
    switch (pro) {
    case SQ_GELU: f(std::integral_constant<int, SQ_GELU>()); break;
    case SQ_DGELU: f(std::integral_constant<int, SQ_DGELU>()); break;
    case SQ_SWIGLU: f(std::integral_constant<int, SQ_SWIGLU>()); break;
    case SQ_DGATE: f(std::integral_constant<int, SQ_DGATE>()); break;
    case SQ_DUP: f(std::integral_constant<int, SQ_DUP>()); break;
    default: f(std::integral_constant<int, SQ_PLAIN>()); break;
    }
}

template <fp8_format FMT, int KIND>
static void launch_scaled_pro(cuda_state *s, const sq_args &a, unsigned tiles, int pro,
                              int colsum) {
    with_pro(pro, [&](auto p) {
        constexpr int PRO = decltype(p)::value;
        /* SwiGLU's prologues take no column sums (operand_kind.h never asks): no COLSUM
         * instantiation of them */
        if constexpr (PRO == SQ_SWIGLU || PRO == SQ_DGATE || PRO == SQ_DUP) {
            scaled_tile_kernel<FMT, KIND, PRO, false><<<tiles, SQ_THREADS, 0, s->stream>>>(a);
            CUDA_LAUNCH_CHECK(s);
        } else {
            launch_scaled_tiles<FMT, KIND, PRO>(s, a, tiles, colsum);
        }
    });
}

template <fp8_format FMT>
static void launch_scaled_kind(cuda_state *s, const sq_args &a, unsigned tiles, int kind, int pro,
                               int colsum) {
    if (kind == SQ_VEC)
        launch_scaled_pro<FMT, SQ_VEC>(s, a, tiles, pro, colsum);
    else if (kind == SQ_BLK)
        launch_scaled_pro<FMT, SQ_BLK>(s, a, tiles, pro, colsum);
    else
        launch_scaled_pro<FMT, SQ_ROW>(s, a, tiles, pro, colsum);
}

void cuda_quantize_scaled(fp8t_backend *b, const fp8t_scaled_quant *q) {
    const int rows = q->rows, cols = q->cols;
    if (rows <= 0 || cols <= 0 || (!q->codes && !q->codes_t && !q->amax_out && !q->colsum))
        return;
    if (q->scaling != FP8T_SCALING_VEC128 && q->scaling != FP8T_SCALING_BLK128 &&
        q->scaling != FP8T_SCALING_ROW) {
        FP8T_FATAL("quantize_scaled: scaling %d is not a block kind", (int)q->scaling);
    }
    cuda_state *s = cuda_of(b);
    const int pro = q->gelu                                ? SQ_GELU
                    : (q->gelu_x || q->gelu_x16)           ? SQ_DGELU
                    : q->swiglu                            ? SQ_SWIGLU
                    : q->dswiglu == FP8T_STEP_DSWIGLU_GATE ? SQ_DGATE
                    : q->dswiglu == FP8T_STEP_DSWIGLU_UP   ? SQ_DUP
                                                           : SQ_PLAIN;
    const int swiglu_pro = pro == SQ_SWIGLU || pro == SQ_DGATE || pro == SQ_DUP;
    const int fused =
        !s->plain && rows % 16 == 0 && cols % 4 == 0 && aligned16(q->x) && aligned16(q->gelu_x) &&
        aligned16(q->gelu_x16) && aligned16(q->gelu_save16) && (!q->bias || aligned16(q->bias)) &&
        (!q->codes || aligned4(q->codes)) && (!q->codes_t || aligned16(q->codes_t)) &&
        aligned16(q->gate) && aligned16(q->gate16) && aligned16(q->up) && aligned16(q->up16) &&
        aligned16(q->swiglu_save16[0]) && aligned16(q->swiglu_save16[1]) &&
        !(swiglu_pro && (q->colsum || q->bias));
    if (!fused) {
        /* the values in scratch where a prologue applies (the unfused ops' bits), then the
         * column sums, the amax and each orientation on its own */
        const size_t n = (size_t)rows * cols;
        const float *v = q->x;
        if (swiglu_pro) {
            float *y = (float *)cuda_scratch(b, SCR_ACT, n * sizeof(float));
            if (pro == SQ_SWIGLU)
                cuda_swiglu_forward(b, y, q->x, q->up, q->swiglu_save16[0], q->swiglu_save16[1],
                                    n);
            else
                cuda_swiglu_grad(b, y, q->dswiglu, q->x, q->gate, q->gate16, q->up, q->up16, n);
            v = y;
        } else if (pro != SQ_PLAIN) {
            float *y = (float *)cuda_scratch(b, SCR_ACT, n * sizeof(float));
            const float *gx = cuda_bf16_widen(b, SCR_GELU_X, q->gelu_x, q->gelu_x16, n);
            if (pro == SQ_GELU && q->gelu_save16)
                cuda_bf16_pack(b, q->gelu_save16, q->x, q->bias, rows, cols);
            if (pro == SQ_GELU) {
                gelu_scratch_kernel<<<ew_blocks(s, n, 4), EW_THREADS, 0, s->stream>>>(
                    y, q->x, q->bias, cols, n);
                CUDA_LAUNCH_CHECK(s);
            } else if (q->bias) {
                cuda_gelu_backward_bias(b, y, gx, q->bias, q->x, rows, cols);
            } else {
                cuda_gelu_backward(b, y, gx, q->x, n);
            }
            v = y;
        }
        if (q->colsum) cuda_column_sums(b, q->colsum, v, rows, cols);
        if (q->amax_out) cuda_amax(b, q->amax_out, v, n);
        if (q->codes)
            cuda_block_quantize(b, q->codes, q->scale_inv, v, rows, cols, 0, q->scaling, q->fmt,
                                q->pow2);
        if (q->codes_t)
            cuda_block_quantize(b, q->codes_t, q->scale_inv_t, v, rows, cols, 1, q->scaling,
                                q->fmt, q->pow2);
        return;
    }
    const int tiles_r = (rows + SQ_TILE - 1) / SQ_TILE, tiles_c = (cols + SQ_TILE - 1) / SQ_TILE;
    const unsigned tiles = (unsigned)((size_t)tiles_r * tiles_c);
    sq_args a;
    memset(&a, 0, sizeof(a));
    a.codes = q->codes, a.codes_t = q->codes_t;
    a.sinv = q->scale_inv, a.sinv_t = q->scale_inv_t;
    a.amax_out = q->amax_out;
    a.x = q->x, a.gx = q->gelu_x, a.bias = q->bias;
    a.gx16 = q->gelu_x16, a.save16 = q->gelu_save16;
    if (pro == SQ_SWIGLU) a.save16 = q->swiglu_save16[0], a.save16_2 = q->swiglu_save16[1];
    if (pro == SQ_DGATE || pro == SQ_DUP) a.gx = q->gate, a.gx16 = q->gate16;
    a.up = q->up, a.up16 = q->up16;
    a.rows = rows, a.cols = cols, a.tiles_c = tiles_c;
    a.fmt_max = q->fmt == FP8_E4M3 ? FP8_E4M3_MAX : FP8_E5M2_MAX;
    a.pow2 = q->pow2;
    if (q->colsum)
        a.part = (float *)cuda_scratch(b, SCR_COLSUM, (size_t)tiles_r * cols * sizeof(float));
    const int kind = q->scaling == FP8T_SCALING_VEC128   ? SQ_VEC
                     : q->scaling == FP8T_SCALING_BLK128 ? SQ_BLK
                                                         : SQ_ROW;
    if (kind == SQ_ROW) {
        /* the whole-row and whole-column amaxes first (they span other tiles) */
        unsigned *bits = (unsigned *)cuda_scratch(
            b, SCR_QUANT, ((size_t)rows + (size_t)cols) * sizeof(unsigned));
        a.row_bits = bits, a.col_bits = bits + rows;
        CUDA_CHECK(cudaMemsetAsync(bits, 0, ((size_t)rows + cols) * sizeof(unsigned), s->stream));
        sq_args a1 = a;
        a1.save16 = a1.save16_2 = NULL; /* written by the second pass */
        with_pro(pro, [&](auto p) {
            scaled_amax_kernel<decltype(p)::value><<<tiles, SQ_THREADS, 0, s->stream>>>(a1);
        });
        CUDA_LAUNCH_CHECK(s);
        a.amax_out = NULL; /* taken by the first pass */
    }
    if (q->codes || q->codes_t || q->colsum) {
        const int cs = q->colsum != NULL;
        if (q->fmt == FP8_E4M3)
            launch_scaled_kind<FP8_E4M3>(s, a, tiles, kind, pro, cs);
        else
            launch_scaled_kind<FP8_E5M2>(s, a, tiles, kind, pro, cs);
    }
    if (q->colsum) cuda_column_sums_finish(b, q->colsum, a.part, tiles_r, cols);
}
