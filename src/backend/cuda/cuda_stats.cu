/* CUDA backend — tensor_stats: the statistics of a tensor and of its FP8 images (stats.h,
 * fp8t_stats_raw), computed on the device so that --inspect does not copy every tensor to the
 * host. The CPU reference is fp8t_stats_raw_compute (src/numerics/stats_raw.c).
 *
 * Both passes over x walk it in 1x128 row tiles, one warp per tile (lane l takes columns
 * l, l+32, l+64, l+96 of it: four coalesced loads in flight, and an element's row and column
 * come from the tile's index without a division per element), tiles dealt to the warps of a
 * grid that is as large as the GPU holds at once (SMs x resident blocks of that kernel), so
 * no block waits for a second wave. Kernels, all on the backend's stream, nothing waits:
 *   P1  moments of x (counts, min, max, amax, sums in double) and, in the same read, the
 *       per-tile multipliers of every 1x128 TILES image (what-ifs, block scaling of
 *       activations) and of the MXFP8 image (a tile's 4 groups of 32 lanes' columns are
 *       its 4 MX blocks); one moments partial per block into scratch;
 *   A2  one block merges the partials in index order, writes the moments into *out, and the
 *       per-tensor scale of each SCALE / CURRENT image (CURRENT from the amax of P1);
 *   T   tile multipliers of any other tile shape (128x1, 128x128), one block per tile;
 *   B   second pass: sum (x - mean)^2 and, per image, q = dequant(quant(x)): the underflow
 *       and clipping counts and sum (q-x)^2, sum xq, sum q^2; partials per block. A tile
 *       multiplier's index is shifts for power-of-two tiles (every tile the recipes use);
 *   B2  one block merges them in order into *out;
 *   K, K2  (block=N) one block per N elements, then one block summarizing them.
 * Every reduction is a fixed tree over a fixed partition (the grid is a function of n and of
 * the device), so the result is the same bits on every run; sums are in double (a float
 * value, its square and a product of two floats are exact in double), so they agree with the
 * CPU's compensated sums to about 1e-15 relative. */
#include "backend/cuda/cuda_common.cuh"

#include <atomic>
#include <math.h>

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
    int fmt[FP8T_STATS_MAX_IMAGES];   /* element format (MX: E4M3) */
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
} stats_params;

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
    if (isnan(v)) { a->nnan++; return; }
    if (isinf(v)) { a->ninf++; return; }
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
static unsigned st_grid(const cuda_state *s, const void *kernel, std::atomic<int> *occ,
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
#define ST_TILE_LOOP(t, ntiles)                                                              \
    for (size_t t = (size_t)blockIdx.x * ST_WARPS + (threadIdx.x >> 5); t < (ntiles);          \
         t += (size_t)gridDim.x * ST_WARPS)

/* ---- P1: moments, and the 1x128 / MX tile multipliers from the same read.
 * mask: bit k set for each 1x128 TILES image k; mx: the MX image's index, or -1. ---- */
__global__ void __launch_bounds__(ST_THREADS)
    stats_pass1_kernel(mom_acc *part, img_specs sp, const float *__restrict__ x, int rows,
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
                    at, sp.fmt[k] == FP8_E5M2 ? FP8_E5M2_MAX : FP8_E4M3_MAX, 0.0f, sp.pow2[k]);
    }
    sh[threadIdx.x] = a;
    tree_reduce<mom_acc, mom_merge>(sh);
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

__global__ void __launch_bounds__(ST_THREADS)
    stats_moments_finish(fp8t_stats_raw *out, stats_params *prm, const mom_acc *part,
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
        if (sp.kind[k] == FP8T_IMG_SCALE) sc = *sp.scale[k];
        else if (sp.kind[k] == FP8T_IMG_CURRENT)
            sc = current_scale_dev(a.qamax, sp.fmt[k] == FP8_E5M2 ? FP8_E5M2_MAX : FP8_E4M3_MAX,
                                   sp.eps[k], sp.pow2[k]);
        prm->scale[k] = sc;
        out->img[k].scale = (double)sc;
    }
}

/* ---- T: per-tile multiplier of image k (TILES: the block's current scale; MX: 2^-e, NaN
 * for a block holding NaN or Inf) ---- */
__global__ void stats_tiles_kernel(float *tiles, const float *__restrict__ x, int rows, int cols,
                                   int tr, int tc, int fmt, int mx, int pow2) {
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
            current_scale_dev(acc, fmt == FP8_E5M2 ? FP8_E5M2_MAX : FP8_E4M3_MAX, 0.0f, pow2);
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
    stats_images_kernel(img_acc *part, double *dev_part, const stats_params *prm,
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
    stats_images_finish(fp8t_stats_raw *out, const img_acc *part, const double *dev_part,
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
    stats_blocks_kernel(fp8t_block_raw *list, const stats_params *prm,
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
        r.underflow_pct = sh[0].nonzero ? 100.0 * (double)sh[0].under / (double)sh[0].nonzero : 0.0;
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
    stats_blocks_finish(fp8t_stats_raw *out, const fp8t_block_raw *list, size_t nb, int bs) {
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

/* ---- tile_stats: each tile of image 0 (TILES) on its own, one block per tile, then one
 * block summarizing them in tile order (the CPU's ordered scan: the first tile of the lowest
 * SQNR and of the highest underflow) ---- */
__global__ void __launch_bounds__(ST_THREADS)
    stats_tile_errors_kernel(fp8t_block_raw *list, const float *__restrict__ x, int rows,
                             int cols, img_specs sp) {
    __shared__ blk_acc sh[ST_THREADS];
    const int tr = sp.tr[0], tc = sp.tc[0], nbc = sp.nbc[0];
    const int r0 = (int)(blockIdx.x / nbc) * tr, c0 = (int)(blockIdx.x % nbc) * tc;
    const int nr = min(tr, rows - r0), nc = min(tc, cols - c0);
    const float m = sp.tiles[0][blockIdx.x];
    const int fmt = sp.fmt[0];
    blk_acc a = {0.0f, 0, 0, 0.0, 0.0};
    for (int i = threadIdx.x; i < nr * nc; i += ST_THREADS) {
        const float v = x[(size_t)(r0 + i / nc) * cols + c0 + i % nc];
        if (!isfinite(v)) continue;
        const float q = image_value(v, m, fmt, 0);
        const double dv = (double)v, e = (double)q - dv;
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
        r.amax = 0.0;
        r.sqnr_db = sqnr_dev(sh[0].xx, sh[0].err);
        r.underflow_pct = sh[0].nonzero ? 100.0 * (double)sh[0].under / (double)sh[0].nonzero : 0.0;
        list[blockIdx.x] = r;
    }
}

typedef struct {
    double sq_min, up_max;
    ull sq_idx, up_idx, with_under;
} tile_sum;

__device__ __forceinline__ void tile_sum_merge(tile_sum *a, const tile_sum *b) {
    if (b->sq_min < a->sq_min || (b->sq_min == a->sq_min && b->sq_idx < a->sq_idx))
        a->sq_min = b->sq_min, a->sq_idx = b->sq_idx;
    if (b->up_max > a->up_max || (b->up_max == a->up_max && b->up_idx < a->up_idx))
        a->up_max = b->up_max, a->up_idx = b->up_idx;
    a->with_under += b->with_under;
}

__global__ void __launch_bounds__(ST_THREADS)
    stats_tile_errors_finish(fp8t_stats_raw *out, const fp8t_block_raw *list, size_t nt) {
    __shared__ tile_sum sh[ST_THREADS];
    tile_sum a = {INFINITY, -1.0, ~0ull, ~0ull, 0};
    for (size_t t = threadIdx.x; t < nt; t += ST_THREADS) {
        const fp8t_block_raw *r = &list[t];
        if (r->sqnr_db < a.sq_min) a.sq_min = r->sqnr_db, a.sq_idx = t;
        if (r->underflow_pct > a.up_max) a.up_max = r->underflow_pct, a.up_idx = t;
        a.with_under += r->underflow_pct > 0.0;
    }
    sh[threadIdx.x] = a;
    tree_reduce<tile_sum, tile_sum_merge>(sh);
    if (threadIdx.x == 0) {
        out->n_tiles = nt;
        out->tile_sqnr_min_db = sh[0].sq_min;
        out->tile_sqnr_min_index = sh[0].sq_idx == ~0ull ? 0 : sh[0].sq_idx;
        out->tile_underflow_max_pct = sh[0].up_max;
        out->tile_underflow_max_index = sh[0].up_idx == ~0ull ? 0 : sh[0].up_idx;
        out->tiles_with_underflow = sh[0].with_under;
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
    const unsigned grid1 = st_grid(s, (const void *)stats_pass1_kernel, &occ1, nwalk);
    const unsigned grid2 = st_grid(s, (const void *)stats_images_kernel, &occ2, nwalk);
    /* scratch: P1 partials | params | B partials | dev partials | tiles... | block list */
    size_t off_par = align_up(grid1 * sizeof(mom_acc), 256);
    size_t off_b = off_par + align_up(sizeof(stats_params), 256);
    size_t off_dev = off_b + align_up((size_t)grid2 * FP8T_STATS_MAX_IMAGES * sizeof(img_acc), 256);
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
                fprintf(stderr, "fp8train: tensor_stats: image %d has tile %dx%d (must be positive)\n",
                        k, tr, tc);
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
    const int tstats = req && nimg > 0 && req->tile_stats && sp.kind[0] == FP8T_IMG_TILES;
    const size_t off_tlist = end;
    if (tstats) end += align_up(ntiles[0] * sizeof(fp8t_block_raw), 256);
    char *scr = (char *)cuda_scratch(b, SCR_STATS, end);
    mom_acc *partA = (mom_acc *)scr;
    stats_params *prm = (stats_params *)(scr + off_par);
    img_acc *partB = (img_acc *)(scr + off_b);
    double *devp = (double *)(scr + off_dev);
    for (int k = 0; k < nimg; k++)
        if (ntiles[k]) sp.tiles[k] = (float *)(scr + tile_off[k]);

    /* 1x128 tiles and MX blocks in the moments' read (the what-ifs always ask for both) */
    unsigned mask128 = 0;
    int mx_k = -1;
    for (int k = 0; k < nimg; k++) {
        if (sp.kind[k] == FP8T_IMG_TILES && sp.tr[k] == 1 && sp.tc[k] == ST_TILE) mask128 |= 1u << k;
        else if (sp.kind[k] == FP8T_IMG_MX && mx_k < 0) mx_k = k;
    }
    stats_pass1_kernel<<<grid1, ST_THREADS, 0, s->stream>>>(partA, sp, x, wr, wc, mask128, mx_k);
    CUDA_LAUNCH_CHECK(s);
    stats_moments_finish<<<1, ST_THREADS, 0, s->stream>>>(out, prm, partA, (int)grid1, n, sp);
    CUDA_LAUNCH_CHECK(s);
    for (int k = 0; k < nimg; k++) {
        if (!ntiles[k] || (mask128 >> k & 1u) || k == mx_k) continue;
        int cnt = sp.tr[k] * sp.tc[k];
        stats_tiles_kernel<<<(unsigned)ntiles[k], cnt >= 1024 ? 256 : (cnt > 32 ? 128 : 32), 0,
                             s->stream>>>(sp.tiles[k], x, rows, cols, sp.tr[k], sp.tc[k],
                                          sp.fmt[k], sp.kind[k] == FP8T_IMG_MX, sp.pow2[k]);
        CUDA_LAUNCH_CHECK(s);
    }
    stats_images_kernel<<<grid2, ST_THREADS, 0, s->stream>>>(partB, devp, prm, x, wr, wc, sp);
    CUDA_LAUNCH_CHECK(s);
    stats_images_finish<<<1, ST_THREADS, 0, s->stream>>>(out, partB, devp, (int)grid2, nimg);
    CUDA_LAUNCH_CHECK(s);
    if (bs > 0) {
        fp8t_block_raw *list = req->block_list ? req->block_list : (fp8t_block_raw *)(scr + off_list);
        stats_blocks_kernel<<<(unsigned)nb, ST_THREADS, 0, s->stream>>>(
            list, prm, x, n, (size_t)bs, req->block_img, sp.fmt[req->block_img]);
        CUDA_LAUNCH_CHECK(s);
        stats_blocks_finish<<<1, ST_THREADS, 0, s->stream>>>(out, list, nb, bs);
        CUDA_LAUNCH_CHECK(s);
    }
    if (tstats) {
        fp8t_block_raw *tl = (fp8t_block_raw *)(scr + off_tlist);
        stats_tile_errors_kernel<<<(unsigned)ntiles[0], ST_THREADS, 0, s->stream>>>(tl, x, rows,
                                                                                 cols, sp);
        CUDA_LAUNCH_CHECK(s);
        stats_tile_errors_finish<<<1, ST_THREADS, 0, s->stream>>>(out, tl, ntiles[0]);
        CUDA_LAUNCH_CHECK(s);
    }
}
