/* dev/cuda/stats_ladder.cu — tensor_stats (src/backend/cuda/cuda_stats.cu, the device
 * statistics of --inspect), every version kept: each is checked against the CPU reference
 * (fp8t_stats_raw_compute, src/numerics/stats_raw.c) on the same tensors, then all are timed
 * on the tensors --inspect reads at GPT-2 124M, batch 32 x 1024.
 *
 * Build and run from the repository root (the CUDA runtime and libfp8train.a for the CPU
 * reference):
 *
 *   make build/dev/cuda/stats_ladder && build/dev/cuda/stats_ladder
 *
 * (scripts/gpu-session.sh run runs build-gpu/dev/cuda/stats_ladder when it was carried.)
 * Optional arguments: `stats_ladder [--bench-only] [iters]` (timed calls per case, default 5;
 * --bench-only skips the checks, for a profiler that needs the timed launches alone).
 *
 * Versions:
 *   1  cuda_stats.cu of the first device statistics, verbatim inside namespace v1 (kernels
 *      renamed v1_stats_*, or argument-dependent lookup would find two versions): a grid
 *      capped at 512 blocks walking x element by element (a 64-bit division and modulo per
 *      element for its row and column, a division per element and tile image for the tile
 *      index, MX by a double division, the clipping test by the toolkit's non-saturating
 *      cast, which is software), moments and 1x128 tiles in two reads.
 *   2  the row-tile rewrite, verbatim inside namespace v2 (v2_ names): both passes walk 1x128
 *      row tiles, one warp per tile, lane l on columns l, l+32, l+64, l+96; the moments and
 *      the 1x128 / MX tile multipliers (five-level butterflies per column group, the MX
 *      exponent by double frexp / ldexp on lane 0) in the first read; per element and image
 *      the hardware FP8 cast and back, an IEEE division, the error sums in double (a
 *      conversion per element and image); 64-bit divisions per tile.
 *   3  cuda_stats.cu as it is now (#included below, so this is the shipped code): the
 *      moments alone in the first read (float4, grid-stride); in the second, 4 row tiles per
 *      warp and iteration, lane l on 4 consecutive columns (one float4), so a 3-level
 *      butterfly gives the MX block amax and 2 more the tile's; the 1x128 scale divisions one
 *      lane per tile; the FP8 value by float arithmetic (numerics/fp8_round_hd.h), the
 *      division back by a Markstein step from a per-tile reciprocal, error sums in float over
 *      16 elements (prescaled by a power of two) then in double; tile coordinates stepped,
 *      not divided; a request without images (a result) reads x once: the first pass also
 *      sums the deviations from a per-thread shift, merged by Chan's formula (until the tenth
 *      session it took a second grid-stride pass for them); tensors below 2^-100 and out-of-range delayed scales take exact double
 *      paths (a second P2 instance, the slow class); the uniform and 1x128 images share one
 *      copy of each arithmetic body (127 registers: 4 blocks per multiprocessor, and less hot
 *      code for the instruction cache), and the deviations are summed in float, prescaled and
 *      shifted by the float mean (the shift taken out in F2). (Measured and not kept, in
 *      bench/RESULTS.md: the operand's deviation sum in the first read, as a result's, 4%
 *      slower per call on the H200; the next iteration's tiles fetched before this one's are
 *      computed, no faster on the H100 at 3 blocks, slower than 4 blocks without it.)
 *
 * Checks (all must pass before anything is timed), on shapes with and without a partial
 * 1x128 tile at the row end, rows that are not a multiple of 4 floats (scalar loads), data with
 * zeros, values that underflow and clip, variants with NaN and Inf, with a whole row of NaN,
 * scaled down into the float subnormals and up by 2^100, and requests with a clipping delayed
 * scale, an infinite one, and 128x128 / 3x100 block images: against the CPU reference every
 * count, min / max / amax / smallest nonzero, every scale and the block summary equal, every
 * sum within 1e-6 relative (tests/gpu/gpu_test.c's criterion); each version twice gives the
 * same bytes. Version 3 must pass all; where an older version disagrees the line says so.
 *
 * Timing: CUDA events around `iters` calls of each version on the same tensor; ms per call
 * and the bandwidth of two reads of x per ms of version 3 (the floor: ~0.2 ms per GB of x at
 * the H200's ~4 TB/s). */
#include "backend/cuda/cuda_stats.cu"

#include <stdlib.h>
#include <string.h>

#include "fp8train/stats.h" /* fp8t_stats_raw_compute, from libfp8train.a */

/* ---- what cuda_stats.cu asks of the rest of the backend (not linked in) ---- */
void *cuda_scratch(fp8t_backend *b, int slot, size_t bytes) {
    cuda_state *s = cuda_of(b);
    if (s->scratch_bytes[slot] < bytes) {
        CUDA_CHECK(cudaStreamSynchronize(s->stream));
        if (s->scratch[slot]) CUDA_CHECK(cudaFree(s->scratch[slot]));
        CUDA_CHECK(cudaMalloc(&s->scratch[slot], bytes));
        s->scratch_bytes[slot] = bytes;
    }
    return s->scratch[slot];
}

/* ---- version 1: the previous cuda_stats.cu, verbatim but for the namespace and names ---- */
namespace v1 {

#define ST_THREADS 256
#define ST_MAX_GRID 512
#define ST_MX_BLOCK 32
#define SQNR_EXACT_DEV 1e300

typedef unsigned long long ull;

/* the image specs as a kernel argument (by value) */
typedef struct {
    int n;
    int kind[FP8T_STATS_MAX_IMAGES];
    int fmt[FP8T_STATS_MAX_IMAGES]; /* element format (MX: E4M3) */
    int tr[FP8T_STATS_MAX_IMAGES], tc[FP8T_STATS_MAX_IMAGES];
    const float *scale[FP8T_STATS_MAX_IMAGES];
    float eps[FP8T_STATS_MAX_IMAGES];
    int pow2[FP8T_STATS_MAX_IMAGES];
    float *tiles[FP8T_STATS_MAX_IMAGES]; /* TILES / MX: per-tile multiplier, row-major */
    int nbc[FP8T_STATS_MAX_IMAGES];      /* tiles per tile row */
} img_specs;

/* what A2 leaves for B and K: the mean and the per-tensor multipliers */
typedef struct {
    double mean;
    float qamax; /* amax as the quantizers take it (NaN wins, Inf counts) */
    float scale[FP8T_STATS_MAX_IMAGES];
} v1_stats_params;

typedef struct {
    ull nf, nnan, ninf, nzero;
    float mn, mx, amax, minnz, qamax;
    double sum, sabs, ssq;
} mom_acc;

typedef struct {
    ull under, sat;
    double err, xq, qq;
} img_acc;

__device__ __forceinline__ void mom_init(mom_acc *a) {
    a->nf = a->nnan = a->ninf = a->nzero = 0;
    a->mn = INFINITY, a->mx = -INFINITY, a->amax = 0.0f, a->minnz = INFINITY, a->qamax = 0.0f;
    a->sum = a->sabs = a->ssq = 0.0;
}

__device__ __forceinline__ void mom_add(mom_acc *a, float v) {
    a->qamax = amax_merge_dev(a->qamax, v);
    if (isnan(v)) {
        a->nnan++;
        return;
    }
    if (isinf(v)) {
        a->ninf++;
        return;
    }
    float av = fabsf(v);
    a->nf++;
    if (v == 0.0f) a->nzero++;
    a->mn = fminf(a->mn, v);
    a->mx = fmaxf(a->mx, v);
    a->amax = fmaxf(a->amax, av);
    if (av > 0.0f) a->minnz = fminf(a->minnz, av);
    double d = (double)v;
    a->sum += d;
    a->sabs += fabs(d);
    a->ssq += d * d;
}

__device__ __forceinline__ void mom_merge(mom_acc *a, const mom_acc *b) {
    a->nf += b->nf, a->nnan += b->nnan, a->ninf += b->ninf, a->nzero += b->nzero;
    a->mn = fminf(a->mn, b->mn), a->mx = fmaxf(a->mx, b->mx);
    a->amax = fmaxf(a->amax, b->amax), a->minnz = fminf(a->minnz, b->minnz);
    a->qamax = amax_merge_dev(a->qamax, b->qamax);
    a->sum += b->sum, a->sabs += b->sabs, a->ssq += b->ssq;
}

__device__ __forceinline__ void img_init(img_acc *a) {
    a->under = a->sat = 0;
    a->err = a->xq = a->qq = 0.0;
}

__device__ __forceinline__ void img_merge(img_acc *a, const img_acc *b) {
    a->under += b->under, a->sat += b->sat;
    a->err += b->err, a->xq += b->xq, a->qq += b->qq;
}

/* Fixed-order tree over the block's ST_THREADS entries of sh; the result in sh[0]. */
template <typename T, void (*MERGE)(T *, const T *)>
__device__ __forceinline__ void tree_reduce(T *sh) {
    for (int s = ST_THREADS / 2; s > 0; s >>= 1) {
        __syncthreads();
        if ((int)threadIdx.x < s) MERGE(&sh[threadIdx.x], &sh[threadIdx.x + s]);
    }
    __syncthreads();
}

/* The non-saturating cast overflows (stats.h: fp8_overflows): the value was clipped. */
__device__ __forceinline__ int fp8_overflows_dev(float v, int fmt) {
    if (isnan(v)) return 0;
    unsigned c =
        (unsigned)__nv_cvt_float_to_fp8(v, __NV_NOSAT, fmt == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2) &
        0x7Fu;
    return c == (fmt == FP8_E5M2 ? 0x7Cu : 0x7Fu);
}

static unsigned st_grid(size_t n) {
    size_t g = (n + ST_THREADS * 4 - 1) / (ST_THREADS * 4);
    if (g < 1) g = 1;
    return (unsigned)(g < ST_MAX_GRID ? g : ST_MAX_GRID);
}

/* ---- A: moments ---- */
__global__ void __launch_bounds__(ST_THREADS)
    v1_stats_moments_kernel(mom_acc *part, const float *__restrict__ x, size_t n) {
    __shared__ mom_acc sh[ST_THREADS];
    mom_acc a;
    mom_init(&a);
    size_t stride = (size_t)gridDim.x * ST_THREADS;
    for (size_t i = (size_t)blockIdx.x * ST_THREADS + threadIdx.x; i < n; i += stride)
        mom_add(&a, x[i]);
    sh[threadIdx.x] = a;
    tree_reduce<mom_acc, mom_merge>(sh);
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

__global__ void __launch_bounds__(ST_THREADS)
    v1_stats_moments_finish(fp8t_stats_raw *out, v1_stats_params *prm, const mom_acc *part,
                            int nparts, size_t n, img_specs sp) {
    __shared__ mom_acc sh[ST_THREADS];
    mom_acc a;
    mom_init(&a);
    for (int k = threadIdx.x; k < nparts; k += ST_THREADS) mom_merge(&a, &part[k]);
    sh[threadIdx.x] = a;
    tree_reduce<mom_acc, mom_merge>(sh);
    if (threadIdx.x != 0) return;
    a = sh[0];
    out->n = n;
    out->n_finite = a.nf, out->n_nan = a.nnan, out->n_inf = a.ninf, out->n_zero = a.nzero;
    out->min = a.mn, out->max = a.mx, out->amax = a.amax, out->min_nonzero = a.minnz;
    out->sum = a.sum, out->sum_abs = a.sabs, out->sum_sq = a.ssq;
    out->n_images = sp.n;
    prm->mean = a.nf ? a.sum / (double)a.nf : 0.0;
    prm->qamax = a.qamax;
    for (int k = 0; k < sp.n; k++) {
        float sc = __int_as_float(0x7fc00000);
        if (sp.kind[k] == FP8T_IMG_SCALE)
            sc = *sp.scale[k];
        else if (sp.kind[k] == FP8T_IMG_CURRENT)
            sc = current_scale_dev(a.qamax, sp.fmt[k] == FP8_E5M2 ? FP8_E5M2_MAX : FP8_E4M3_MAX,
                                   sp.eps[k], sp.pow2[k]);
        prm->scale[k] = sc;
        out->img[k].scale = (double)sc;
    }
}

/* ---- T: per-tile multiplier of image k (TILES: the block's current scale; MX: 2^-e, NaN
 * for a block holding NaN or Inf) ---- */
__global__ void v1_stats_tiles_kernel(float *tiles, const float *__restrict__ x, int rows,
                                      int cols, int tr, int tc, int fmt, int mx) {
    int nbc = (cols + tc - 1) / tc;
    int br = (int)(blockIdx.x / nbc), bc = (int)(blockIdx.x % nbc);
    int r0 = br * tr, c0 = bc * tc;
    int nr = min(tr, rows - r0), nc = min(tc, cols - c0);
    int cnt = nr * nc;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < cnt; i += blockDim.x)
        acc = amax_merge_dev(acc, x[(size_t)(r0 + i / nc) * cols + c0 + i % nc]);
    acc = block_amax(acc);
    if (threadIdx.x != 0) return;
    if (mx) {
        int eb = mx_biased_exponent(acc);
        tiles[blockIdx.x] = eb == 0xFF ? __int_as_float(0x7fc00000) : ldexpf(1.0f, 127 - eb);
    } else {
        tiles[blockIdx.x] =
            current_scale_dev(acc, fmt == FP8_E5M2 ? FP8_E5M2_MAX : FP8_E4M3_MAX, 0.0f, 0);
    }
}

/* ---- T128: the same for every 1x128 TILES image and the MXFP8 image at once, in one read:
 * one block of 128 threads per 1x128 row tile; its 4 warps are the tile's 4 MX blocks (a
 * 1x128 tile starts at a multiple of 128, so it holds whole 1x32 blocks but at a row's end).
 * mask: bit k set for each 1x128 TILES image k; mx: the MX image's index, or -1. ---- */
__global__ void __launch_bounds__(128)
    v1_stats_rowtiles_kernel(img_specs sp, const float *__restrict__ x, int rows, int cols,
                             unsigned mask, int mx) {
    int nbc = (cols + 127) / 128;
    int r = (int)(blockIdx.x / nbc), bc = (int)(blockIdx.x % nbc);
    int c = bc * 128 + (int)threadIdx.x;
    float a = amax_merge_dev(0.0f, c < cols ? x[(size_t)r * cols + c] : 0.0f);
    a = warp_amax(a); /* every lane: the amax of its warp's 32 elements */
    if (mx >= 0 && (threadIdx.x & 31) == 0 && c < cols) {
        int eb = mx_biased_exponent(a);
        sp.tiles[mx][(size_t)r * sp.nbc[mx] + c / ST_MX_BLOCK] =
            eb == 0xFF ? __int_as_float(0x7fc00000) : ldexpf(1.0f, 127 - eb);
    }
    a = block_amax(a);
    if (threadIdx.x != 0) return;
    for (int k = 0; k < sp.n; k++)
        if (mask >> k & 1u)
            sp.tiles[k][(size_t)r * nbc + bc] = current_scale_dev(
                a, sp.fmt[k] == FP8_E5M2 ? FP8_E5M2_MAX : FP8_E4M3_MAX, 0.0f, 0);
}

/* The image value of x at multiplier m: decode(encode(x*m)) / m; MX divides in double and
 * rounds once (as fp8t_mxfp8_dequantize's decode * 2^e: m is a power of two). */
__device__ __forceinline__ float image_value(float v, float m, int fmt, int mx) {
    float d = fp8_dec_dev(fp8_enc_dev(v * m, (fp8_format)fmt), (fp8_format)fmt);
    return mx ? (float)((double)d / (double)m) : d / m;
}

/* ---- B: deviation and image errors ---- */
__global__ void __launch_bounds__(ST_THREADS)
    v1_stats_images_kernel(img_acc *part, double *dev_part, const v1_stats_params *prm,
                           const float *__restrict__ x, size_t n, int cols, img_specs sp) {
    __shared__ img_acc sh[ST_THREADS];
    __shared__ double shd[ST_THREADS];
    /* per-thread accumulators in registers: every index below is a constant after unrolling;
     * the counts are 32-bit here (a thread sees at most n / (ST_MAX_GRID * ST_THREADS)
     * elements of a tensor below 2^40 elements) */
    unsigned under[FP8T_STATS_MAX_IMAGES], sat[FP8T_STATS_MAX_IMAGES];
    double err[FP8T_STATS_MAX_IMAGES], xq[FP8T_STATS_MAX_IMAGES], qq[FP8T_STATS_MAX_IMAGES];
    float m[FP8T_STATS_MAX_IMAGES];
#pragma unroll
    for (int k = 0; k < FP8T_STATS_MAX_IMAGES; k++) {
        under[k] = sat[k] = 0;
        err[k] = xq[k] = qq[k] = 0.0;
        m[k] = k < sp.n ? prm->scale[k] : 0.0f;
    }
    const double mean = prm->mean;
    double dev = 0.0;
    size_t stride = (size_t)gridDim.x * ST_THREADS;
    for (size_t i = (size_t)blockIdx.x * ST_THREADS + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        if (!isfinite(v)) continue;
        double dv = (double)v, dd = dv - mean;
        dev += dd * dd;
        int r = (int)(i / (size_t)cols), c = (int)(i % (size_t)cols);
#pragma unroll
        for (int k = 0; k < FP8T_STATS_MAX_IMAGES; k++) {
            if (k >= sp.n) break;
            int kind = sp.kind[k], mx = kind == FP8T_IMG_MX;
            float mk = m[k];
            if (kind == FP8T_IMG_TILES || mx)
                mk = sp.tiles[k][(size_t)(r / sp.tr[k]) * sp.nbc[k] + c / sp.tc[k]];
            float q = image_value(v, mk, sp.fmt[k], mx);
            double qv = (double)q, e = qv - dv;
            under[k] += (v != 0.0f && q == 0.0f);
            sat[k] += fp8_overflows_dev(v * mk, sp.fmt[k]);
            err[k] += e * e;
            xq[k] += dv * qv;
            qq[k] += qv * qv;
        }
    }
    shd[threadIdx.x] = dev;
    for (int s = ST_THREADS / 2; s > 0; s >>= 1) {
        __syncthreads();
        if ((int)threadIdx.x < s) shd[threadIdx.x] += shd[threadIdx.x + s];
    }
    __syncthreads();
    if (threadIdx.x == 0) dev_part[blockIdx.x] = shd[0];
#pragma unroll
    for (int k = 0; k < FP8T_STATS_MAX_IMAGES; k++) {
        if (k >= sp.n) break; /* uniform over the block: the barriers below stay matched */
        img_acc a;
        a.under = under[k], a.sat = sat[k], a.err = err[k], a.xq = xq[k], a.qq = qq[k];
        sh[threadIdx.x] = a;
        tree_reduce<img_acc, img_merge>(sh);
        if (threadIdx.x == 0) part[(size_t)blockIdx.x * FP8T_STATS_MAX_IMAGES + k] = sh[0];
    }
}

__global__ void __launch_bounds__(ST_THREADS)
    v1_stats_images_finish(fp8t_stats_raw *out, const img_acc *part, const double *dev_part,
                           int nparts, int nimg) {
    __shared__ img_acc sh[ST_THREADS];
    __shared__ double shd[ST_THREADS];
    double dev = 0.0;
    for (int p = threadIdx.x; p < nparts; p += ST_THREADS) dev += dev_part[p];
    shd[threadIdx.x] = dev;
    for (int s = ST_THREADS / 2; s > 0; s >>= 1) {
        __syncthreads();
        if ((int)threadIdx.x < s) shd[threadIdx.x] += shd[threadIdx.x + s];
    }
    __syncthreads();
    if (threadIdx.x == 0) out->dev_sq = shd[0];
    for (int k = 0; k < nimg; k++) {
        img_acc a;
        img_init(&a);
        for (int p = threadIdx.x; p < nparts; p += ST_THREADS)
            img_merge(&a, &part[(size_t)p * FP8T_STATS_MAX_IMAGES + k]);
        sh[threadIdx.x] = a;
        tree_reduce<img_acc, img_merge>(sh);
        if (threadIdx.x == 0) {
            fp8t_image_raw *ir = &out->img[k];
            ir->n_underflow = sh[0].under, ir->n_sat = sh[0].sat;
            ir->err_sq = sh[0].err, ir->xq = sh[0].xq, ir->qq = sh[0].qq;
        }
    }
}

/* ---- K: block=N statistics at the per-tensor multiplier of image bimg ---- */
typedef struct {
    float amax;
    ull nonzero, under;
    double xx, err;
} blk_acc;

__device__ __forceinline__ void blk_merge(blk_acc *a, const blk_acc *b) {
    a->amax = fmaxf(a->amax, b->amax);
    a->nonzero += b->nonzero, a->under += b->under;
    a->xx += b->xx, a->err += b->err;
}

__device__ __forceinline__ double sqnr_dev(double xx, double err) {
    if (err == 0.0) return SQNR_EXACT_DEV;
    if (xx == 0.0) return -SQNR_EXACT_DEV;
    return 10.0 * log10(xx / err);
}

__global__ void __launch_bounds__(ST_THREADS)
    v1_stats_blocks_kernel(fp8t_block_raw *list, const v1_stats_params *prm,
                           const float *__restrict__ x, size_t n, size_t bs, int bimg, int fmt) {
    __shared__ blk_acc sh[ST_THREADS];
    const float m = prm->scale[bimg];
    size_t lo = (size_t)blockIdx.x * bs, hi = lo + bs < n ? lo + bs : n;
    blk_acc a = {0.0f, 0, 0, 0.0, 0.0};
    for (size_t i = lo + threadIdx.x; i < hi; i += ST_THREADS) {
        float v = x[i];
        if (!isfinite(v)) continue;
        float q = image_value(v, m, fmt, 0);
        double dv = (double)v, e = (double)q - dv;
        a.amax = fmaxf(a.amax, fabsf(v));
        a.xx += dv * dv;
        a.err += e * e;
        if (v != 0.0f) {
            a.nonzero++;
            a.under += q == 0.0f;
        }
    }
    sh[threadIdx.x] = a;
    tree_reduce<blk_acc, blk_merge>(sh);
    if (threadIdx.x == 0) {
        fp8t_block_raw r;
        r.amax = sh[0].amax;
        r.sqnr_db = sqnr_dev(sh[0].xx, sh[0].err);
        r.underflow_pct =
            sh[0].nonzero ? 100.0 * (double)sh[0].under / (double)sh[0].nonzero : 0.0;
        list[blockIdx.x] = r;
    }
}

typedef struct {
    double sq_min;
    ull sq_idx, with_under;
    double amax_max, amax_min_nz, under_max;
} blk_sum;

__device__ __forceinline__ void blk_sum_merge(blk_sum *a, const blk_sum *b) {
    /* the first block of the smallest SQNR, as the CPU's ordered scan finds it */
    if (b->sq_min < a->sq_min || (b->sq_min == a->sq_min && b->sq_idx < a->sq_idx))
        a->sq_min = b->sq_min, a->sq_idx = b->sq_idx;
    a->with_under += b->with_under;
    a->amax_max = fmax(a->amax_max, b->amax_max);
    a->amax_min_nz = fmin(a->amax_min_nz, b->amax_min_nz);
    a->under_max = fmax(a->under_max, b->under_max);
}

__global__ void __launch_bounds__(ST_THREADS)
    v1_stats_blocks_finish(fp8t_stats_raw *out, const fp8t_block_raw *list, size_t nb, int bs) {
    __shared__ blk_sum sh[ST_THREADS];
    blk_sum a = {INFINITY, ~0ull, 0, 0.0, INFINITY, 0.0};
    for (size_t b = threadIdx.x; b < nb; b += ST_THREADS) {
        const fp8t_block_raw *r = &list[b];
        if (r->sqnr_db < a.sq_min) a.sq_min = r->sqnr_db, a.sq_idx = b;
        a.with_under += r->underflow_pct > 0.0;
        a.amax_max = fmax(a.amax_max, r->amax);
        if (r->amax > 0.0) a.amax_min_nz = fmin(a.amax_min_nz, r->amax);
        a.under_max = fmax(a.under_max, r->underflow_pct);
    }
    sh[threadIdx.x] = a;
    tree_reduce<blk_sum, blk_sum_merge>(sh);
    if (threadIdx.x == 0) {
        out->block = bs;
        out->n_blocks = nb;
        out->block_sqnr_min_db = sh[0].sq_min;
        out->block_sqnr_min_index = sh[0].sq_idx == ~0ull ? 0 : sh[0].sq_idx;
        out->blocks_with_underflow = sh[0].with_under;
        out->block_amax_max = sh[0].amax_max;
        out->block_amax_min_nonzero = sh[0].amax_min_nz;
        out->block_underflow_max_pct = sh[0].under_max;
    }
}

void cuda_tensor_stats(fp8t_backend *b, fp8t_stats_raw *out, const float *x, int rows, int cols,
                       const fp8t_stats_req *req) {
    cuda_state *s = cuda_of(b);
    CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(*out), s->stream));
    const size_t n = rows > 0 && cols > 0 ? (size_t)rows * (size_t)cols : 0;
    img_specs sp;
    memset(&sp, 0, sizeof sp);
    int nimg = req ? req->n_images : 0;
    if (nimg > FP8T_STATS_MAX_IMAGES) nimg = FP8T_STATS_MAX_IMAGES;
    if (nimg < 0 || n == 0) nimg = 0;
    sp.n = nimg;
    /* scratch: A partials | params | B partials | dev partials | tiles... | block list */
    const unsigned grid = st_grid(n);
    size_t off_par = align_up(grid * sizeof(mom_acc), 256);
    size_t off_b = off_par + align_up(sizeof(v1_stats_params), 256);
    size_t off_dev =
        off_b + align_up((size_t)grid * FP8T_STATS_MAX_IMAGES * sizeof(img_acc), 256);
    size_t off_tiles = off_dev + align_up(grid * sizeof(double), 256);
    size_t tile_off[FP8T_STATS_MAX_IMAGES] = {0}, ntiles[FP8T_STATS_MAX_IMAGES] = {0};
    size_t end = off_tiles;
    for (int k = 0; k < nimg; k++) {
        const fp8t_image_spec *is = &req->img[k];
        sp.kind[k] = is->kind;
        sp.fmt[k] = is->kind == FP8T_IMG_MX ? FP8_E4M3 : is->fmt;
        sp.scale[k] = is->scale;
        sp.eps[k] = is->epsilon;
        sp.pow2[k] = is->pow2;
        if (is->kind == FP8T_IMG_TILES || is->kind == FP8T_IMG_MX) {
            int tr = is->kind == FP8T_IMG_MX ? 1 : is->tile_r;
            int tc = is->kind == FP8T_IMG_MX ? ST_MX_BLOCK : is->tile_c;
            if (tr <= 0 || tc <= 0) {
                fprintf(stderr,
                        "fp8train: tensor_stats: image %d has tile %dx%d (must be positive)\n", k,
                        tr, tc);
                exit(1);
            }
            sp.tr[k] = tr, sp.tc[k] = tc;
            sp.nbc[k] = (cols + tc - 1) / tc;
            ntiles[k] = (size_t)((rows + tr - 1) / tr) * (size_t)sp.nbc[k];
            tile_off[k] = end;
            end += align_up(ntiles[k] * sizeof(float), 256);
        } else if (is->kind == FP8T_IMG_SCALE && !is->scale) {
            fprintf(stderr, "fp8train: tensor_stats: image %d (SCALE) has no scale pointer\n", k);
            exit(1);
        }
    }
    size_t nb = 0, off_list = end;
    const int bs = req && nimg > 0 && req->block > 0 && req->block_img >= 0 &&
                           req->block_img < nimg &&
                           (req->img[req->block_img].kind == FP8T_IMG_SCALE ||
                            req->img[req->block_img].kind == FP8T_IMG_CURRENT)
                       ? req->block
                       : 0;
    if (bs > 0) {
        nb = (n + (size_t)bs - 1) / (size_t)bs;
        if (!req->block_list) end += align_up(nb * sizeof(fp8t_block_raw), 256);
    }
    char *scr = (char *)cuda_scratch(b, SCR_STATS, end);
    mom_acc *partA = (mom_acc *)scr;
    v1_stats_params *prm = (v1_stats_params *)(scr + off_par);
    img_acc *partB = (img_acc *)(scr + off_b);
    double *devp = (double *)(scr + off_dev);
    for (int k = 0; k < nimg; k++)
        if (ntiles[k]) sp.tiles[k] = (float *)(scr + tile_off[k]);

    v1_stats_moments_kernel<<<grid, ST_THREADS, 0, s->stream>>>(partA, x, n);
    CUDA_LAUNCH_CHECK(s);
    v1_stats_moments_finish<<<1, ST_THREADS, 0, s->stream>>>(out, prm, partA, (int)grid, n, sp);
    CUDA_LAUNCH_CHECK(s);
    /* 1x128 tiles and MX blocks from one read (the what-ifs always ask for both) */
    unsigned mask128 = 0;
    int mx_k = -1;
    for (int k = 0; k < nimg; k++) {
        if (sp.kind[k] == FP8T_IMG_TILES && sp.tr[k] == 1 && sp.tc[k] == 128)
            mask128 |= 1u << k;
        else if (sp.kind[k] == FP8T_IMG_MX && mx_k < 0)
            mx_k = k;
    }
    if (mask128 || mx_k >= 0) {
        v1_stats_rowtiles_kernel<<<(unsigned)((size_t)rows * cdiv_u(cols, 128)), 128, 0,
                                   s->stream>>>(sp, x, rows, cols, mask128, mx_k);
        CUDA_LAUNCH_CHECK(s);
    }
    for (int k = 0; k < nimg; k++) {
        if (!ntiles[k] || (mask128 >> k & 1u) || k == mx_k) continue;
        int cnt = sp.tr[k] * sp.tc[k];
        v1_stats_tiles_kernel<<<(unsigned)ntiles[k], cnt >= 1024 ? 256 : (cnt > 32 ? 128 : 32), 0,
                                s->stream>>>(sp.tiles[k], x, rows, cols, sp.tr[k], sp.tc[k],
                                             sp.fmt[k], sp.kind[k] == FP8T_IMG_MX);
        CUDA_LAUNCH_CHECK(s);
    }
    v1_stats_images_kernel<<<grid, ST_THREADS, 0, s->stream>>>(partB, devp, prm, x, n,
                                                               cols > 0 ? cols : 1, sp);
    CUDA_LAUNCH_CHECK(s);
    v1_stats_images_finish<<<1, ST_THREADS, 0, s->stream>>>(out, partB, devp, (int)grid, nimg);
    CUDA_LAUNCH_CHECK(s);
    if (bs > 0) {
        fp8t_block_raw *list =
            req->block_list ? req->block_list : (fp8t_block_raw *)(scr + off_list);
        v1_stats_blocks_kernel<<<(unsigned)nb, ST_THREADS, 0, s->stream>>>(
            list, prm, x, n, (size_t)bs, req->block_img, sp.fmt[req->block_img]);
        CUDA_LAUNCH_CHECK(s);
        v1_stats_blocks_finish<<<1, ST_THREADS, 0, s->stream>>>(out, list, nb, bs);
        CUDA_LAUNCH_CHECK(s);
    }
}

} /* namespace v1 */

/* ---- version 2: cuda_stats.cu before the one-read-per-image rewrite, verbatim but for the
 * namespace and the v2_ names ---- */
namespace v2 {
#define ST_THREADS 256
#define ST_WARPS (ST_THREADS / 32)
#define ST_TILE 128 /* the row tile both passes walk: 32 lanes x 4 columns */
#define ST_MX_BLOCK 32
#define SQNR_EXACT_DEV 1e300

typedef unsigned long long ull;

/* the image specs as a kernel argument (by value) */
typedef struct {
    int n;
    int kind[FP8T_STATS_MAX_IMAGES];
    int fmt[FP8T_STATS_MAX_IMAGES]; /* element format (MX: E4M3) */
    int tr[FP8T_STATS_MAX_IMAGES], tc[FP8T_STATS_MAX_IMAGES];
    const float *scale[FP8T_STATS_MAX_IMAGES];
    float eps[FP8T_STATS_MAX_IMAGES];
    int pow2[FP8T_STATS_MAX_IMAGES];
    float *tiles[FP8T_STATS_MAX_IMAGES]; /* TILES / MX: per-tile multiplier, row-major */
    int nbc[FP8T_STATS_MAX_IMAGES];      /* tiles per tile row */
    int shr[FP8T_STATS_MAX_IMAGES], shc[FP8T_STATS_MAX_IMAGES]; /* log2 of tr / tc, or -1 */
} img_specs;

/* what A2 leaves for B and K: the mean and the per-tensor multipliers */
typedef struct {
    double mean;
    float qamax; /* amax as the quantizers take it (NaN wins, Inf counts) */
    float scale[FP8T_STATS_MAX_IMAGES];
} v2_stats_params;

typedef struct {
    ull nf, nnan, ninf, nzero;
    float mn, mx, amax, minnz, qamax;
    double sum, sabs, ssq;
} mom_acc;

typedef struct {
    ull under, sat;
    double err, xq, qq;
} img_acc;

__device__ __forceinline__ void mom_init(mom_acc *a) {
    a->nf = a->nnan = a->ninf = a->nzero = 0;
    a->mn = INFINITY, a->mx = -INFINITY, a->amax = 0.0f, a->minnz = INFINITY, a->qamax = 0.0f;
    a->sum = a->sabs = a->ssq = 0.0;
}

__device__ __forceinline__ void mom_add(mom_acc *a, float v) {
    a->qamax = amax_merge_dev(a->qamax, v);
    if (isnan(v)) {
        a->nnan++;
        return;
    }
    if (isinf(v)) {
        a->ninf++;
        return;
    }
    float av = fabsf(v);
    a->nf++;
    if (v == 0.0f) a->nzero++;
    a->mn = fminf(a->mn, v);
    a->mx = fmaxf(a->mx, v);
    a->amax = fmaxf(a->amax, av);
    if (av > 0.0f) a->minnz = fminf(a->minnz, av);
    double d = (double)v;
    a->sum += d;
    a->sabs += fabs(d);
    a->ssq += d * d;
}

__device__ __forceinline__ void mom_merge(mom_acc *a, const mom_acc *b) {
    a->nf += b->nf, a->nnan += b->nnan, a->ninf += b->ninf, a->nzero += b->nzero;
    a->mn = fminf(a->mn, b->mn), a->mx = fmaxf(a->mx, b->mx);
    a->amax = fmaxf(a->amax, b->amax), a->minnz = fminf(a->minnz, b->minnz);
    a->qamax = amax_merge_dev(a->qamax, b->qamax);
    a->sum += b->sum, a->sabs += b->sabs, a->ssq += b->ssq;
}

__device__ __forceinline__ void img_init(img_acc *a) {
    a->under = a->sat = 0;
    a->err = a->xq = a->qq = 0.0;
}

__device__ __forceinline__ void img_merge(img_acc *a, const img_acc *b) {
    a->under += b->under, a->sat += b->sat;
    a->err += b->err, a->xq += b->xq, a->qq += b->qq;
}

/* Fixed-order tree over the block's ST_THREADS entries of sh; the result in sh[0]. */
template <typename T, void (*MERGE)(T *, const T *)>
__device__ __forceinline__ void tree_reduce(T *sh) {
    for (int s = ST_THREADS / 2; s > 0; s >>= 1) {
        __syncthreads();
        if ((int)threadIdx.x < s) MERGE(&sh[threadIdx.x], &sh[threadIdx.x + s]);
    }
    __syncthreads();
}

/* The non-saturating cast overflows (stats.h: fp8_overflows): the value was clipped. With
 * round-to-nearest-even that is |v| > 464 for E4M3 (464, halfway between 448 and 480, rounds
 * to the even 448) and |v| >= 61440 for E5M2 (halfway between 57344 and 65536 rounds to the
 * even 2^16); NaN compares false. A compare instead of the toolkit's non-saturating cast,
 * which is software (only the saturating cast is an instruction) and was most of the cost of
 * an image; tests/test_stats.c checks the thresholds against fp8_overflows. */
#define FP8_E4M3_OVERFLOW_ABOVE 464.0f
#define FP8_E5M2_OVERFLOW_FROM 61440.0f
__device__ __forceinline__ int fp8_overflows_dev(float v, int fmt) {
    const float a = fabsf(v);
    return fmt == FP8_E5M2 ? a >= FP8_E5M2_OVERFLOW_FROM : a > FP8_E4M3_OVERFLOW_ABOVE;
}

/* The grid of a tile-walking kernel: one warp per tile up to as many blocks as the GPU keeps
 * resident at once (a larger grid would run its last blocks as a second, mostly idle wave,
 * since every warp's share of tiles is fixed). */
static unsigned v2_st_grid(const cuda_state *s, const void *kernel, std::atomic<int> *occ,
                           size_t ntiles) {
    /* asked once per kernel (a function of the kernel and the architecture; a few us a call,
     * and an inspected step makes hundreds) */
    int per_sm = occ->load(std::memory_order_relaxed);
    if (per_sm <= 0) {
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, ST_THREADS, 0));
        occ->store(per_sm, std::memory_order_relaxed);
    }
    size_t cap = (size_t)s->num_sms * (size_t)(per_sm > 0 ? per_sm : 1);
    size_t g = (ntiles + ST_WARPS - 1) / ST_WARPS;
    if (g < 1) g = 1;
    return (unsigned)(g < cap ? g : cap);
}

/* The walk of both passes: tile t of a rows x cols tensor is row t / nbc, columns
 * (t % nbc) * 128 + [0, 128); each warp takes tiles warp, warp + W, ... (W warps in the
 * grid). Lane l holds columns c0 + l + 32 j, j = 0..3. */
#define ST_TILE_LOOP(t, ntiles)                                                                  \
    for (size_t t = (size_t)blockIdx.x * ST_WARPS + (threadIdx.x >> 5); t < (ntiles);            \
         t += (size_t)gridDim.x * ST_WARPS)

/* ---- P1: moments, and the 1x128 / MX tile multipliers from the same read.
 * mask: bit k set for each 1x128 TILES image k; mx: the MX image's index, or -1. ---- */
__global__ void __launch_bounds__(ST_THREADS)
    v2_stats_pass1_kernel(mom_acc *part, img_specs sp, const float *__restrict__ x, int rows,
                          int cols, unsigned mask, int mx) {
    __shared__ mom_acc sh[ST_THREADS];
    const int lane = (int)(threadIdx.x & 31);
    const int nbc = (cols + ST_TILE - 1) / ST_TILE;
    const size_t ntiles = (size_t)rows * (size_t)nbc;
    mom_acc a;
    mom_init(&a);
    ST_TILE_LOOP(t, ntiles) {
        const int r = (int)(t / (size_t)nbc), bc = (int)(t % (size_t)nbc);
        const int c0 = bc * ST_TILE;
        const float *xr = x + (size_t)r * (size_t)cols;
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int c = c0 + 32 * j + lane;
            v[j] = c < cols ? xr[c] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (c0 + 32 * j + lane < cols) mom_add(&a, v[j]);
        if (!mask && mx < 0) continue; /* uniform over the grid */
        float am[4], at = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            am[j] = warp_amax(amax_merge_dev(0.0f, v[j])); /* padding is 0: no effect */
            at = amax_merge_dev(at, am[j]);
        }
        if (lane != 0) continue;
        if (mx >= 0) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                if (c0 + 32 * j >= cols) break;
                const int eb = mx_biased_exponent(am[j]);
                sp.tiles[mx][(size_t)r * sp.nbc[mx] + (size_t)(c0 / ST_MX_BLOCK + j)] =
                    eb == 0xFF ? __int_as_float(0x7fc00000) : ldexpf(1.0f, 127 - eb);
            }
        }
        for (int k = 0; k < sp.n; k++)
            if (mask >> k & 1u)
                sp.tiles[k][(size_t)r * nbc + bc] = current_scale_dev(
                    at, sp.fmt[k] == FP8_E5M2 ? FP8_E5M2_MAX : FP8_E4M3_MAX, 0.0f, 0);
    }
    sh[threadIdx.x] = a;
    tree_reduce<mom_acc, mom_merge>(sh);
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

__global__ void __launch_bounds__(ST_THREADS)
    v2_stats_moments_finish(fp8t_stats_raw *out, v2_stats_params *prm, const mom_acc *part,
                            int nparts, size_t n, img_specs sp) {
    __shared__ mom_acc sh[ST_THREADS];
    mom_acc a;
    mom_init(&a);
    for (int k = threadIdx.x; k < nparts; k += ST_THREADS) mom_merge(&a, &part[k]);
    sh[threadIdx.x] = a;
    tree_reduce<mom_acc, mom_merge>(sh);
    if (threadIdx.x != 0) return;
    a = sh[0];
    out->n = n;
    out->n_finite = a.nf, out->n_nan = a.nnan, out->n_inf = a.ninf, out->n_zero = a.nzero;
    out->min = a.mn, out->max = a.mx, out->amax = a.amax, out->min_nonzero = a.minnz;
    out->sum = a.sum, out->sum_abs = a.sabs, out->sum_sq = a.ssq;
    out->n_images = sp.n;
    prm->mean = a.nf ? a.sum / (double)a.nf : 0.0;
    prm->qamax = a.qamax;
    for (int k = 0; k < sp.n; k++) {
        float sc = __int_as_float(0x7fc00000);
        if (sp.kind[k] == FP8T_IMG_SCALE)
            sc = *sp.scale[k];
        else if (sp.kind[k] == FP8T_IMG_CURRENT)
            sc = current_scale_dev(a.qamax, sp.fmt[k] == FP8_E5M2 ? FP8_E5M2_MAX : FP8_E4M3_MAX,
                                   sp.eps[k], sp.pow2[k]);
        prm->scale[k] = sc;
        out->img[k].scale = (double)sc;
    }
}

/* ---- T: per-tile multiplier of image k (TILES: the block's current scale; MX: 2^-e, NaN
 * for a block holding NaN or Inf) ---- */
__global__ void v2_stats_tiles_kernel(float *tiles, const float *__restrict__ x, int rows,
                                      int cols, int tr, int tc, int fmt, int mx) {
    int nbc = (cols + tc - 1) / tc;
    int br = (int)(blockIdx.x / nbc), bc = (int)(blockIdx.x % nbc);
    int r0 = br * tr, c0 = bc * tc;
    int nr = min(tr, rows - r0), nc = min(tc, cols - c0);
    int cnt = nr * nc;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < cnt; i += blockDim.x)
        acc = amax_merge_dev(acc, x[(size_t)(r0 + i / nc) * cols + c0 + i % nc]);
    acc = block_amax(acc);
    if (threadIdx.x != 0) return;
    if (mx) {
        int eb = mx_biased_exponent(acc);
        tiles[blockIdx.x] = eb == 0xFF ? __int_as_float(0x7fc00000) : ldexpf(1.0f, 127 - eb);
    } else {
        tiles[blockIdx.x] =
            current_scale_dev(acc, fmt == FP8_E5M2 ? FP8_E5M2_MAX : FP8_E4M3_MAX, 0.0f, 0);
    }
}

/* The image value of x at multiplier m: decode(encode(x*m)) / m; MX rounds d / m once from
 * double (as fp8t_mxfp8_dequantize's decode * 2^e). There m is a power of two 2^-e, e in
 * [-127, 127], so its reciprocal is exact in float (subnormals kept: no fast-math) and
 * d * (1/m) in double is d / m exactly: a multiply instead of a double division. */
__device__ __forceinline__ float image_value(float v, float m, int fmt, int mx) {
    float d = fp8_dec_dev(fp8_enc_dev(v * m, (fp8_format)fmt), (fp8_format)fmt);
    return mx ? (float)((double)d * (double)__frcp_rn(m)) : d / m;
}

/* The multiplier of image k at (r, c): the tensor's, or its tile's (shifts when the tile's
 * sides are powers of two). */
__device__ __forceinline__ float image_mult(const img_specs &sp, const float *m, int k, int r,
                                            int c) {
    if (sp.kind[k] != FP8T_IMG_TILES && sp.kind[k] != FP8T_IMG_MX) return m[k];
    const int tr = sp.shr[k] >= 0 ? r >> sp.shr[k] : r / sp.tr[k];
    const int tc = sp.shc[k] >= 0 ? c >> sp.shc[k] : c / sp.tc[k];
    return sp.tiles[k][(size_t)tr * sp.nbc[k] + tc];
}

/* ---- B: deviation and image errors ---- */
__global__ void __launch_bounds__(ST_THREADS)
    v2_stats_images_kernel(img_acc *part, double *dev_part, const v2_stats_params *prm,
                           const float *__restrict__ x, int rows, int cols, img_specs sp) {
    __shared__ img_acc sh[ST_THREADS];
    __shared__ double shd[ST_THREADS];
    /* per-thread accumulators in registers: every index below is a constant after unrolling;
     * the counts are 32-bit here (a thread sees about n / (grid * ST_THREADS) elements, the
     * grid at least the SM count: far below 2^32 for any tensor below 2^40 elements) */
    unsigned under[FP8T_STATS_MAX_IMAGES], sat[FP8T_STATS_MAX_IMAGES];
    double err[FP8T_STATS_MAX_IMAGES], xq[FP8T_STATS_MAX_IMAGES], qq[FP8T_STATS_MAX_IMAGES];
    float m[FP8T_STATS_MAX_IMAGES];
#pragma unroll
    for (int k = 0; k < FP8T_STATS_MAX_IMAGES; k++) {
        under[k] = sat[k] = 0;
        err[k] = xq[k] = qq[k] = 0.0;
        m[k] = k < sp.n ? prm->scale[k] : 0.0f;
    }
    const double mean = prm->mean;
    double dev = 0.0;
    const int lane = (int)(threadIdx.x & 31);
    const int nbc = (cols + ST_TILE - 1) / ST_TILE;
    const size_t ntiles = (size_t)rows * (size_t)nbc;
    ST_TILE_LOOP(t, ntiles) {
        const int r = (int)(t / (size_t)nbc), c0 = (int)(t % (size_t)nbc) * ST_TILE;
        const float *xr = x + (size_t)r * (size_t)cols;
        float v[4];
        bool ok[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int c = c0 + 32 * j + lane;
            v[j] = c < cols ? xr[c] : 0.0f;
            ok[j] = c < cols && isfinite(v[j]);
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (!ok[j]) continue;
            const double dd = (double)v[j] - mean;
            dev += dd * dd;
        }
#pragma unroll
        for (int k = 0; k < FP8T_STATS_MAX_IMAGES; k++) {
            if (k >= sp.n) break;
            const int fmt = sp.fmt[k], mx = sp.kind[k] == FP8T_IMG_MX;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                if (!ok[j]) continue;
                const float vj = v[j], mk = image_mult(sp, m, k, r, c0 + 32 * j + lane);
                const float q = image_value(vj, mk, fmt, mx);
                const double dv = (double)vj, qv = (double)q, e = qv - dv;
                under[k] += (vj != 0.0f && q == 0.0f);
                sat[k] += fp8_overflows_dev(vj * mk, fmt);
                err[k] += e * e;
                xq[k] += dv * qv;
                qq[k] += qv * qv;
            }
        }
    }
    shd[threadIdx.x] = dev;
    for (int s = ST_THREADS / 2; s > 0; s >>= 1) {
        __syncthreads();
        if ((int)threadIdx.x < s) shd[threadIdx.x] += shd[threadIdx.x + s];
    }
    __syncthreads();
    if (threadIdx.x == 0) dev_part[blockIdx.x] = shd[0];
#pragma unroll
    for (int k = 0; k < FP8T_STATS_MAX_IMAGES; k++) {
        if (k >= sp.n) break; /* uniform over the block: the barriers below stay matched */
        img_acc a;
        a.under = under[k], a.sat = sat[k], a.err = err[k], a.xq = xq[k], a.qq = qq[k];
        sh[threadIdx.x] = a;
        tree_reduce<img_acc, img_merge>(sh);
        if (threadIdx.x == 0) part[(size_t)blockIdx.x * FP8T_STATS_MAX_IMAGES + k] = sh[0];
    }
}

__global__ void __launch_bounds__(ST_THREADS)
    v2_stats_images_finish(fp8t_stats_raw *out, const img_acc *part, const double *dev_part,
                           int nparts, int nimg) {
    __shared__ img_acc sh[ST_THREADS];
    __shared__ double shd[ST_THREADS];
    double dev = 0.0;
    for (int p = threadIdx.x; p < nparts; p += ST_THREADS) dev += dev_part[p];
    shd[threadIdx.x] = dev;
    for (int s = ST_THREADS / 2; s > 0; s >>= 1) {
        __syncthreads();
        if ((int)threadIdx.x < s) shd[threadIdx.x] += shd[threadIdx.x + s];
    }
    __syncthreads();
    if (threadIdx.x == 0) out->dev_sq = shd[0];
    for (int k = 0; k < nimg; k++) {
        img_acc a;
        img_init(&a);
        for (int p = threadIdx.x; p < nparts; p += ST_THREADS)
            img_merge(&a, &part[(size_t)p * FP8T_STATS_MAX_IMAGES + k]);
        sh[threadIdx.x] = a;
        tree_reduce<img_acc, img_merge>(sh);
        if (threadIdx.x == 0) {
            fp8t_image_raw *ir = &out->img[k];
            ir->n_underflow = sh[0].under, ir->n_sat = sh[0].sat;
            ir->err_sq = sh[0].err, ir->xq = sh[0].xq, ir->qq = sh[0].qq;
        }
    }
}

/* ---- K: block=N statistics at the per-tensor multiplier of image bimg ---- */
typedef struct {
    float amax;
    ull nonzero, under;
    double xx, err;
} blk_acc;

__device__ __forceinline__ void blk_merge(blk_acc *a, const blk_acc *b) {
    a->amax = fmaxf(a->amax, b->amax);
    a->nonzero += b->nonzero, a->under += b->under;
    a->xx += b->xx, a->err += b->err;
}

__device__ __forceinline__ double sqnr_dev(double xx, double err) {
    if (err == 0.0) return SQNR_EXACT_DEV;
    if (xx == 0.0) return -SQNR_EXACT_DEV;
    return 10.0 * log10(xx / err);
}

__global__ void __launch_bounds__(ST_THREADS)
    v2_stats_blocks_kernel(fp8t_block_raw *list, const v2_stats_params *prm,
                           const float *__restrict__ x, size_t n, size_t bs, int bimg, int fmt) {
    __shared__ blk_acc sh[ST_THREADS];
    const float m = prm->scale[bimg];
    size_t lo = (size_t)blockIdx.x * bs, hi = lo + bs < n ? lo + bs : n;
    blk_acc a = {0.0f, 0, 0, 0.0, 0.0};
    for (size_t i = lo + threadIdx.x; i < hi; i += ST_THREADS) {
        float v = x[i];
        if (!isfinite(v)) continue;
        float q = image_value(v, m, fmt, 0);
        double dv = (double)v, e = (double)q - dv;
        a.amax = fmaxf(a.amax, fabsf(v));
        a.xx += dv * dv;
        a.err += e * e;
        if (v != 0.0f) {
            a.nonzero++;
            a.under += q == 0.0f;
        }
    }
    sh[threadIdx.x] = a;
    tree_reduce<blk_acc, blk_merge>(sh);
    if (threadIdx.x == 0) {
        fp8t_block_raw r;
        r.amax = sh[0].amax;
        r.sqnr_db = sqnr_dev(sh[0].xx, sh[0].err);
        r.underflow_pct =
            sh[0].nonzero ? 100.0 * (double)sh[0].under / (double)sh[0].nonzero : 0.0;
        list[blockIdx.x] = r;
    }
}

typedef struct {
    double sq_min;
    ull sq_idx, with_under;
    double amax_max, amax_min_nz, under_max;
} blk_sum;

__device__ __forceinline__ void blk_sum_merge(blk_sum *a, const blk_sum *b) {
    /* the first block of the smallest SQNR, as the CPU's ordered scan finds it */
    if (b->sq_min < a->sq_min || (b->sq_min == a->sq_min && b->sq_idx < a->sq_idx))
        a->sq_min = b->sq_min, a->sq_idx = b->sq_idx;
    a->with_under += b->with_under;
    a->amax_max = fmax(a->amax_max, b->amax_max);
    a->amax_min_nz = fmin(a->amax_min_nz, b->amax_min_nz);
    a->under_max = fmax(a->under_max, b->under_max);
}

__global__ void __launch_bounds__(ST_THREADS)
    v2_stats_blocks_finish(fp8t_stats_raw *out, const fp8t_block_raw *list, size_t nb, int bs) {
    __shared__ blk_sum sh[ST_THREADS];
    blk_sum a = {INFINITY, ~0ull, 0, 0.0, INFINITY, 0.0};
    for (size_t b = threadIdx.x; b < nb; b += ST_THREADS) {
        const fp8t_block_raw *r = &list[b];
        if (r->sqnr_db < a.sq_min) a.sq_min = r->sqnr_db, a.sq_idx = b;
        a.with_under += r->underflow_pct > 0.0;
        a.amax_max = fmax(a.amax_max, r->amax);
        if (r->amax > 0.0) a.amax_min_nz = fmin(a.amax_min_nz, r->amax);
        a.under_max = fmax(a.under_max, r->underflow_pct);
    }
    sh[threadIdx.x] = a;
    tree_reduce<blk_sum, blk_sum_merge>(sh);
    if (threadIdx.x == 0) {
        out->block = bs;
        out->n_blocks = nb;
        out->block_sqnr_min_db = sh[0].sq_min;
        out->block_sqnr_min_index = sh[0].sq_idx == ~0ull ? 0 : sh[0].sq_idx;
        out->blocks_with_underflow = sh[0].with_under;
        out->block_amax_max = sh[0].amax_max;
        out->block_amax_min_nonzero = sh[0].amax_min_nz;
        out->block_underflow_max_pct = sh[0].under_max;
    }
}

void cuda_tensor_stats(fp8t_backend *b, fp8t_stats_raw *out, const float *x, int rows, int cols,
                       const fp8t_stats_req *req) {
    cuda_state *s = cuda_of(b);
    CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(*out), s->stream));
    const size_t n = rows > 0 && cols > 0 ? (size_t)rows * (size_t)cols : 0;
    img_specs sp;
    memset(&sp, 0, sizeof sp);
    int nimg = req ? req->n_images : 0;
    if (nimg > FP8T_STATS_MAX_IMAGES) nimg = FP8T_STATS_MAX_IMAGES;
    if (nimg < 0 || n == 0) nimg = 0;
    sp.n = nimg;
    /* the walked shape: nothing for an empty tensor */
    const int wr = n ? rows : 0, wc = n ? cols : 1;
    const size_t nwalk = (size_t)wr * cdiv_u((size_t)wc, ST_TILE);
    static std::atomic<int> occ1(0), occ2(0);
    const unsigned grid1 = v2_st_grid(s, (const void *)v2_stats_pass1_kernel, &occ1, nwalk);
    const unsigned grid2 = v2_st_grid(s, (const void *)v2_stats_images_kernel, &occ2, nwalk);
    /* scratch: P1 partials | params | B partials | dev partials | tiles... | block list */
    size_t off_par = align_up(grid1 * sizeof(mom_acc), 256);
    size_t off_b = off_par + align_up(sizeof(v2_stats_params), 256);
    size_t off_dev =
        off_b + align_up((size_t)grid2 * FP8T_STATS_MAX_IMAGES * sizeof(img_acc), 256);
    size_t off_tiles = off_dev + align_up(grid2 * sizeof(double), 256);
    size_t tile_off[FP8T_STATS_MAX_IMAGES] = {0}, ntiles[FP8T_STATS_MAX_IMAGES] = {0};
    size_t end = off_tiles;
    for (int k = 0; k < nimg; k++) {
        const fp8t_image_spec *is = &req->img[k];
        sp.kind[k] = is->kind;
        sp.fmt[k] = is->kind == FP8T_IMG_MX ? FP8_E4M3 : is->fmt;
        sp.scale[k] = is->scale;
        sp.eps[k] = is->epsilon;
        sp.pow2[k] = is->pow2;
        if (is->kind == FP8T_IMG_TILES || is->kind == FP8T_IMG_MX) {
            int tr = is->kind == FP8T_IMG_MX ? 1 : is->tile_r;
            int tc = is->kind == FP8T_IMG_MX ? ST_MX_BLOCK : is->tile_c;
            if (tr <= 0 || tc <= 0) {
                fprintf(stderr,
                        "fp8train: tensor_stats: image %d has tile %dx%d (must be positive)\n", k,
                        tr, tc);
                exit(1);
            }
            sp.tr[k] = tr, sp.tc[k] = tc;
            sp.shr[k] = (tr & (tr - 1)) ? -1 : __builtin_ctz((unsigned)tr);
            sp.shc[k] = (tc & (tc - 1)) ? -1 : __builtin_ctz((unsigned)tc);
            sp.nbc[k] = (cols + tc - 1) / tc;
            ntiles[k] = (size_t)((rows + tr - 1) / tr) * (size_t)sp.nbc[k];
            tile_off[k] = end;
            end += align_up(ntiles[k] * sizeof(float), 256);
        } else if (is->kind == FP8T_IMG_SCALE && !is->scale) {
            fprintf(stderr, "fp8train: tensor_stats: image %d (SCALE) has no scale pointer\n", k);
            exit(1);
        }
    }
    size_t nb = 0, off_list = end;
    const int bs = req && nimg > 0 && req->block > 0 && req->block_img >= 0 &&
                           req->block_img < nimg &&
                           (req->img[req->block_img].kind == FP8T_IMG_SCALE ||
                            req->img[req->block_img].kind == FP8T_IMG_CURRENT)
                       ? req->block
                       : 0;
    if (bs > 0) {
        nb = (n + (size_t)bs - 1) / (size_t)bs;
        if (!req->block_list) end += align_up(nb * sizeof(fp8t_block_raw), 256);
    }
    char *scr = (char *)cuda_scratch(b, SCR_STATS, end);
    mom_acc *partA = (mom_acc *)scr;
    v2_stats_params *prm = (v2_stats_params *)(scr + off_par);
    img_acc *partB = (img_acc *)(scr + off_b);
    double *devp = (double *)(scr + off_dev);
    for (int k = 0; k < nimg; k++)
        if (ntiles[k]) sp.tiles[k] = (float *)(scr + tile_off[k]);

    /* 1x128 tiles and MX blocks in the moments' read (the what-ifs always ask for both) */
    unsigned mask128 = 0;
    int mx_k = -1;
    for (int k = 0; k < nimg; k++) {
        if (sp.kind[k] == FP8T_IMG_TILES && sp.tr[k] == 1 && sp.tc[k] == ST_TILE)
            mask128 |= 1u << k;
        else if (sp.kind[k] == FP8T_IMG_MX && mx_k < 0)
            mx_k = k;
    }
    v2_stats_pass1_kernel<<<grid1, ST_THREADS, 0, s->stream>>>(partA, sp, x, wr, wc, mask128,
                                                               mx_k);
    CUDA_LAUNCH_CHECK(s);
    v2_stats_moments_finish<<<1, ST_THREADS, 0, s->stream>>>(out, prm, partA, (int)grid1, n, sp);
    CUDA_LAUNCH_CHECK(s);
    for (int k = 0; k < nimg; k++) {
        if (!ntiles[k] || (mask128 >> k & 1u) || k == mx_k) continue;
        int cnt = sp.tr[k] * sp.tc[k];
        v2_stats_tiles_kernel<<<(unsigned)ntiles[k], cnt >= 1024 ? 256 : (cnt > 32 ? 128 : 32), 0,
                                s->stream>>>(sp.tiles[k], x, rows, cols, sp.tr[k], sp.tc[k],
                                             sp.fmt[k], sp.kind[k] == FP8T_IMG_MX);
        CUDA_LAUNCH_CHECK(s);
    }
    v2_stats_images_kernel<<<grid2, ST_THREADS, 0, s->stream>>>(partB, devp, prm, x, wr, wc, sp);
    CUDA_LAUNCH_CHECK(s);
    v2_stats_images_finish<<<1, ST_THREADS, 0, s->stream>>>(out, partB, devp, (int)grid2, nimg);
    CUDA_LAUNCH_CHECK(s);
    if (bs > 0) {
        fp8t_block_raw *list =
            req->block_list ? req->block_list : (fp8t_block_raw *)(scr + off_list);
        v2_stats_blocks_kernel<<<(unsigned)nb, ST_THREADS, 0, s->stream>>>(
            list, prm, x, n, (size_t)bs, req->block_img, sp.fmt[req->block_img]);
        CUDA_LAUNCH_CHECK(s);
        v2_stats_blocks_finish<<<1, ST_THREADS, 0, s->stream>>>(out, list, nb, bs);
        CUDA_LAUNCH_CHECK(s);
    }
}

} /* namespace v2 */

static cuda_state g_state;
static fp8t_backend g_be;
static int n_pass, n_fail;

#define N_VERSIONS 3
typedef void (*stats_fn)(fp8t_backend *, fp8t_stats_raw *, const float *, int, int,
                         const fp8t_stats_req *);
static const stats_fn VERSIONS[N_VERSIONS] = {v1::cuda_tensor_stats, v2::cuda_tensor_stats,
                                              cuda_tensor_stats};

/* The request --inspect makes for an operand of an FP8-delayed GEMM (inspect.c
 * operand_images): the recipe's delayed scale, then the what-ifs. kind 1: block=128 on image
 * 0 as well; kind 2: a result (moments only); kind 3: the delayed scale far too large (most
 * elements clip) and block images 128x128 and 3x100 (the tables of kernel T); kind 4: a
 * delayed scale of +Inf in E5M2 (version 3's slow class). */
static fp8t_image_spec spec(int kind, fp8_format fmt, int tr, int tc, const float *scale) {
    fp8t_image_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.kind = kind, sp.fmt = fmt, sp.tile_r = tr, sp.tile_c = tc, sp.scale = scale;
    return sp;
}

static void inspect_req(fp8t_stats_req *req, const float *scale, int kind) {
    memset(req, 0, sizeof *req);
    if (kind == 2) return;
    req->n_images = 6;
    req->img[0] = spec(FP8T_IMG_SCALE, FP8_E4M3, 0, 0, scale);
    req->img[1] = spec(FP8T_IMG_CURRENT, FP8_E4M3, 0, 0, NULL);
    req->img[2] = spec(FP8T_IMG_CURRENT, FP8_E5M2, 0, 0, NULL);
    req->img[3] = spec(FP8T_IMG_TILES, FP8_E4M3, 1, 128, NULL);
    req->img[4] = spec(FP8T_IMG_TILES, FP8_E5M2, 1, 128, NULL);
    req->img[5] = spec(FP8T_IMG_MX, FP8_E4M3, 0, 0, NULL);
    if (kind == 1) req->block = 128, req->block_img = 0;
    if (kind == 4) req->img[0].fmt = FP8_E5M2;
    if (kind == 3) {
        req->n_images = 8;
        req->img[6] = spec(FP8T_IMG_TILES, FP8_E5M2, 128, 128, NULL);
        req->img[7] = spec(FP8T_IMG_TILES, FP8_E4M3, 3, 100, NULL);
    }
}

/* Normal-ish values over a wide range (some underflow E4M3 at the delayed scale, some clip),
 * zeros, and with bad: NaN and +-Inf; bad 2 also makes row 1 all NaN (MX blocks with no
 * finite element); bad 3 scales everything by 2^-130 (float subnormals), bad 4 by 2^100.
 * Generated on the device: the timed tensors are GBs. */
__global__ void fill_kernel(float *x, size_t n, int cols, unsigned seed, int bad) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
        float u = (float)(h >> 8) * (1.0f / 16777216.0f) - 0.5f;
        float v = u * exp2f((float)((int)(h & 31u) - 20));
        if ((h & 1023u) == 7u) v = 0.0f;
        if (bad && (h & 65535u) == 11u) v = __int_as_float(0x7fc00000);
        if (bad && (h & 65535u) == 12u) v = (h & 65536u) ? INFINITY : -INFINITY;
        if (bad == 2 && i / (size_t)cols == 1) v = __int_as_float(0x7fc00000);
        if (bad == 3) v = ldexpf(v, -130); /* float subnormals and smaller */
        if (bad == 4) v = ldexpf(v, 100);
        x[i] = v;
    }
}

static double rel(double a, double b) {
    if (a == b || (isnan(a) && isnan(b))) return 0;
    double m = fmax(fabs(a), fabs(b));
    return m > 0 ? fabs(a - b) / m : fabs(a - b);
}

static int same(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

/* why[] empty when b (a GPU version) agrees with a (the CPU reference); *err the largest
 * relative difference of a sum */
static void compare_raw(const fp8t_stats_raw *a, const fp8t_stats_raw *b, char *why, size_t len,
                        double *err) {
    why[0] = 0;
    if (a->n != b->n || a->n_finite != b->n_finite || a->n_nan != b->n_nan ||
        a->n_inf != b->n_inf || a->n_zero != b->n_zero || a->n_images != b->n_images ||
        a->n_blocks != b->n_blocks || a->blocks_with_underflow != b->blocks_with_underflow ||
        a->block_sqnr_min_index != b->block_sqnr_min_index)
        snprintf(why, len, "a count differs");
    if (!same(a->min, b->min) || !same(a->max, b->max) || !same(a->amax, b->amax) ||
        !same(a->min_nonzero, b->min_nonzero) || !same(a->block_amax_max, b->block_amax_max) ||
        !same(a->block_underflow_max_pct, b->block_underflow_max_pct))
        snprintf(why, len, "min/max/amax/block summary differ");
    double e = fmax(fmax(rel(a->sum, b->sum), rel(a->sum_abs, b->sum_abs)),
                    fmax(rel(a->sum_sq, b->sum_sq), rel(a->dev_sq, b->dev_sq)));
    e = fmax(e, rel(a->block_sqnr_min_db, b->block_sqnr_min_db));
    for (int k = 0; k < a->n_images && k < FP8T_STATS_MAX_IMAGES; k++) {
        const fp8t_image_raw *p = &a->img[k], *q = &b->img[k];
        if (p->n_underflow != q->n_underflow || p->n_sat != q->n_sat)
            snprintf(why, len, "image %d: underflow %llu/%llu clipped %llu/%llu", k,
                     (unsigned long long)p->n_underflow, (unsigned long long)q->n_underflow,
                     (unsigned long long)p->n_sat, (unsigned long long)q->n_sat);
        if (!same(p->scale, q->scale)) snprintf(why, len, "image %d: scale differs", k);
        e = fmax(e, fmax(rel(p->err_sq, q->err_sq), fmax(rel(p->xq, q->xq), rel(p->qq, q->qq))));
    }
    if (e > 1e-6 && !why[0]) snprintf(why, len, "sums differ by %.3g relative", e);
    *err = e;
}

static void check_case(int rows, int cols, int kind, int bad) {
    const size_t n = (size_t)rows * cols;
    float *x, *d_scale;
    fp8t_stats_raw *d_out, h[2];
    CUDA_CHECK(cudaMalloc(&x, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_scale, sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_out, sizeof(fp8t_stats_raw)));
    fill_kernel<<<256, 256, 0, g_state.stream>>>(x, n, cols, 1234u + (unsigned)rows, bad);
    const float scale = kind == 4 ? INFINITY : kind == 3 ? 4e7f : 40.0f;
    CUDA_CHECK(cudaMemcpy(d_scale, &scale, sizeof scale, cudaMemcpyHostToDevice));
    float *hx = (float *)malloc(n * sizeof(float));
    CUDA_CHECK(cudaMemcpy(hx, x, n * sizeof(float), cudaMemcpyDeviceToHost));
    fp8t_stats_req req;
    inspect_req(&req, &scale, kind); /* the CPU reads the scale from host memory */
    fp8t_stats_raw ref;
    fp8t_stats_raw_compute(&ref, hx, rows, cols, &req);
    inspect_req(&req, d_scale, kind);
    char line[400];
    int n_len = snprintf(line, sizeof line, "%6d x %-6d %-9s%-9s", rows, cols,
                         kind == 4   ? "scale inf"
                         : kind == 3 ? "clip/T"
                         : kind == 2 ? "result"
                         : kind == 1 ? "block=128"
                                     : "operand",
                         bad == 4   ? " x 2^100"
                         : bad == 3 ? " x 2^-130"
                         : bad == 2 ? " NaN row"
                         : bad      ? " NaN/Inf"
                                    : "");
    int ok = 1;
    for (int v = 0; v < N_VERSIONS; v++) {
        /* only the shipped version must pass; the older ones' disagreements are shown */
        for (int rep = 0; rep < 2; rep++) {
            VERSIONS[v](&g_be, d_out, x, rows, cols, &req);
            CUDA_CHECK(cudaStreamSynchronize(g_state.stream));
            CUDA_CHECK(
                cudaMemcpy(&h[rep], d_out, sizeof(fp8t_stats_raw), cudaMemcpyDeviceToHost));
        }
        char why[200];
        double err;
        compare_raw(&ref, &h[0], why, sizeof why, &err);
        if (!why[0] && memcmp(&h[0], &h[1], sizeof(fp8t_stats_raw)))
            snprintf(why, sizeof why, "twice: different bytes");
        const int held = v == N_VERSIONS - 1;
        if (why[0] && held) ok = 0;
        n_len +=
            snprintf(line + n_len, sizeof line - (size_t)n_len, "  v%d %s %.1e%s%s", v + 1,
                     why[0] ? (held ? "FAIL" : "(differs)") : "ok", err, why[0] ? ": " : "", why);
    }
    printf("%-4s %s\n", ok ? "ok" : "FAIL", line);
    if (ok)
        n_pass++;
    else
        n_fail++;
    free(hx);
    CUDA_CHECK(cudaFree(d_out));
    CUDA_CHECK(cudaFree(x));
    CUDA_CHECK(cudaFree(d_scale));
}

static void run_checks(void) {
    static const int shapes[][2] = {{1, 1},     {7, 9},       {37, 300},   {3, 128},
                                    {256, 768}, {1024, 1600}, {64, 50257}, {4096, 4096}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
        for (int kind = 0; kind < 5; kind++)
            for (int bad = 0; bad < 5; bad++) {
                if (bad == 2 && shapes[si][0] < 2) continue;
                check_case(shapes[si][0], shapes[si][1], kind, bad);
            }
}

static void bench(int iters) {
    /* GPT-2 124M, 32 x 1024 tokens: an activation (X of qkv / fc1), the MLP's hidden X
     * (fc2's), the qkv weight, the logits / dlogits (the head's Y and dY) */
    static const struct {
        const char *what;
        int rows, cols, kind;
    } cases[] = {{"X 768", 32768, 768, 0},         {"X 3072", 32768, 3072, 0},
                 {"W qkv", 2304, 768, 0},          {"Y 3072 (result)", 32768, 3072, 2},
                 {"logits (dY)", 32768, 50257, 0}, {"logits (result)", 32768, 50257, 2}};
    printf("\n%-18s %14s %10s %10s %10s %9s %10s\n", "tensor", "shape", "v1 ms", "v2 ms", "v3 ms",
           "v3/v2", "v3 GB/s*");
    float *d_scale;
    CUDA_CHECK(cudaMalloc(&d_scale, sizeof(float)));
    const float scale = 40.0f;
    CUDA_CHECK(cudaMemcpy(d_scale, &scale, sizeof scale, cudaMemcpyHostToDevice));
    fp8t_stats_raw *d_out;
    CUDA_CHECK(cudaMalloc(&d_out, sizeof(fp8t_stats_raw)));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const size_t n = (size_t)cases[ci].rows * cases[ci].cols;
        float *x;
        CUDA_CHECK(cudaMalloc(&x, n * sizeof(float)));
        fill_kernel<<<4096, 256, 0, g_state.stream>>>(x, n, cases[ci].cols, 99u, 0);
        fp8t_stats_req req;
        inspect_req(&req, d_scale, cases[ci].kind);
        float ms[N_VERSIONS];
        for (int v = 0; v < N_VERSIONS; v++) {
            VERSIONS[v](&g_be, d_out, x, cases[ci].rows, cases[ci].cols, &req); /* warm-up */
            CUDA_CHECK(cudaEventRecord(e0, g_state.stream));
            for (int it = 0; it < iters; it++)
                VERSIONS[v](&g_be, d_out, x, cases[ci].rows, cases[ci].cols, &req);
            CUDA_CHECK(cudaEventRecord(e1, g_state.stream));
            CUDA_CHECK(cudaEventSynchronize(e1));
            CUDA_CHECK(cudaEventElapsedTime(&ms[v], e0, e1));
            ms[v] /= (float)iters;
        }
        char shape[32];
        snprintf(shape, sizeof shape, "%dx%d", cases[ci].rows, cases[ci].cols);
        /* version 3 reads x twice with images (moments, then deviation and images), once
         * without (a result) */
        const int passes = cases[ci].kind == 2 ? 1 : 2;
        printf("%-18s %14s %10.3f %10.3f %10.3f %8.2fx %10.0f\n", cases[ci].what, shape, ms[0],
               ms[1], ms[2], ms[1] / ms[2],
               (double)passes * n * sizeof(float) / (ms[2] * 1e-3) / 1e9);
        CUDA_CHECK(cudaFree(x));
    }
    printf("* bytes version 3 reads (two reads of x, one for a result) per ms\n");
    CUDA_CHECK(cudaFree(d_out));
    CUDA_CHECK(cudaFree(d_scale));
}

int main(int argc, char **argv) {
    const int bench_only = argc > 1 && strcmp(argv[1], "--bench-only") == 0;
    const int ia = 1 + bench_only;
    int iters = argc > ia ? atoi(argv[ia]) : 5;
    if (iters < 1 || argc > ia + 1) {
        fprintf(stderr, "usage: %s [--bench-only] [iters >= 1]\n", argv[0]);
        return 2;
    }
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

    if (bench_only)
        printf("checks skipped (--bench-only)\n");
    else
        run_checks();
    if (n_fail) {
        printf("checks failed: not timing\n\n%d passed, %d failed\n", n_pass, n_fail);
        return 1;
    }
    bench(iters);
    printf("\n%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
