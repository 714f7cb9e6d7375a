/* CUDA backend — tensor_stats: the statistics of a tensor and of its FP8 images (stats.h,
 * fp8t_stats_raw), computed on the device so that --inspect does not copy every tensor to the
 * host. The CPU reference is fp8t_stats_raw_compute (src/numerics/stats_raw.c).
 *
 * Two reads of x for a request with images, one without (a result's: P1 alone, below):
 *   P1  the moments, elementwise: counts, min / max / amax / smallest nonzero, and the sums
 *       of x, |x|, x^2 in double; float4 loads in a grid-stride loop, a partial per block;
 *   F1  one block merges the partials in index order, writes the moments into *out and the
 *       parameters of P2: the mean, a power-of-two prescale p ~ 1/amax, and for every image
 *       with one multiplier for the whole tensor (the delayed scale read from its pointer,
 *       current scaling from the amax) that multiplier, its class (may it clip? is it inside
 *       the fast path's range?) and the two floats the division below needs;
 *   T   (only for block images other than 1x128, e.g. 128x128 weights) one block per tile:
 *       the tile's scale, into a table;
 *   P2  sum (x - mean)^2, and every image's error sums in one more read: the
 *       tensor is walked in 1x128 row tiles, 4 tiles per warp and iteration, each lane
 *       holding 4 consecutive columns of each (one float4). The amax of a tile and of its 4
 *       MX blocks of 32 are a butterfly over the warp's registers, so 1x128 block scaling and
 *       MXFP8 know their scales when they encode; the per-tile scale divisions are shared out
 *       to one lane per tile and shuffled back. Per image and element the FP8 value is found
 *       by float arithmetic (numerics/fp8_round_hd.h: exact, no conversion instruction),
 *       divided back by its multiplier with one Markstein correction (exact), and the error
 *       sums run in float over 4 elements, then 4 tiles, then into a double per thread.
 *       The uniform and the 1x128 images share the four bodies of that arithmetic (E4M3 /
 *       E5M2, may clip or not): one copy of each in the loop, whose hot code is what the
 *       instruction cache holds (and 127 registers, 4 blocks per multiprocessor). The
 *       deviations are summed the same way, in float: (p x - p m)^2 with m the mean rounded
 *       to float, and F2 takes out the shift exactly, sum (x - mean)^2 = sum (x - m)^2 -
 *       nf (mean - m)^2 (the cross term is nf (mean - m) times the mean's own rounding);
 *       (A request without images, a result's, has no P2 nor F2: P1 also sums x - s and its
 *       square in double, s one of the thread's own elements, and the partials' (count,
 *       mean, sum (x - mean)^2) merge by Chan's pairwise formula in the fixed tree, so F1
 *       writes the deviation sum from the one read. Against the two-pass sum the error is
 *       a few double roundings times the ratio of (s - mean)^2 to the variance, which the
 *       data bound: far below the 1e-6 the statistics are held to.)
 *   F2  one block merges P2's partials in order and finishes *out.
 * Rows in a wider buffer (req->ld > cols: the head's logits, rows padded to pad(V)) are read
 * in place by P1, in the packed order (so the moments are the packed copy's, bit for bit), and
 * by P2 in row tiles ld apart (its float sums grouped by row, where a packed tensor without
 * tiled images is walked in flat runs of 128: the same to float rounding, not to the bit); the
 * kernels that walk x packed (T, the block=N blocks, the per-tile errors) get a packed copy.
 * Only *out (about 1 KiB) ever reaches the host, by the caller's copy.
 *
 * Exactness. Counts, min, max, amax and the scales are exact (the same as the CPU's). Every
 * image value q is the CPU's float, bit for bit, up to a power-of-two factor p (a product p *
 * q is exact): P2 sums (p q - p x)^2, (p x)(p q) and (p q)^2, all >= 0 (q has x's sign or is
 * 0), so each float partial is within 6 ulps relative (one rounding per product and at most 5
 * additions of non-negative terms: < 4e-7 relative) and the double total is as close; p keeps
 * the squares of tensors as small as 1e-40 or as large as 1e30 in float range. The deviation
 * sum is as close before the shift is taken out (p x - p m is one rounding of an exact
 * difference), and the shift at most doubles its relative error: m is the float nearest the
 * mean, so nf (mean - m)^2 is at most sum (x - mean)^2 whenever some x differs from the
 * mean (the x are floats too). The elements
 * so small against amax that p x leaves the normal range (below 2^-126 amax) can round
 * differently, which moves a sum by less than 2^-250 of it. Where that is not small, a tensor
 * whose amax is below 2^-100 (its values q are float subnormals, rounded on the subnormal
 * grid), P2 runs as a second instance (TINY) with p = 1, q by IEEE division and the sums in
 * double; both instances are launched and the one that does not match the amax returns at
 * once. A delayed scale the fast path cannot take (0, NaN, Inf, subnormal, negative, or one
 * that clips nearly everything by more than 2^40, so that every (p q)^2 would underflow) is
 * computed per element exactly as the CPU does (the slow class, double sums).
 * Underflows are counted as elements whose FP8 value is 0, less the elements that are 0 in x
 * (which are 0 in every image), both exact.
 * Determinism: every partition is a function of the sizes and the device (grids are as large
 * as the GPU holds at once), every sum a fixed sequence and a fixed tree, so the result is the
 * same bits run to run. */
#include "backend/cuda/cuda_common.cuh"
#include "numerics/fp8_round_hd.h"

#include <atomic>
#include <float.h>
#include <math.h>

#define ST_THREADS 256    /* P1, the finishing kernels, K */
#define ST_P2_THREADS 128 /* P2 */
#ifndef ST_P2_MINB
#define ST_P2_MINB 1 /* P2's blocks per multiprocessor asked of the register allocator */
#endif
#define ST_P2_WARPS (ST_P2_THREADS / 32)
#define ST_U 4 /* 1x128 tiles per warp and iteration in P2 */
#define ST_TILE 128
#define ST_P1_UNROLL 4 /* float4 loads per thread and iteration in P1 */
#define ST_MX_BLOCK 32
#define ST_NIMG FP8T_STATS_MAX_IMAGES
#define SQNR_EXACT_DEV 1e300
#define ST_FULL 0xffffffffu
static_assert(ST_U == 4, "image_run's pairwise sums are written for 4 tiles");

typedef unsigned long long ull;

/* How P2 computes an image. Uniform: one multiplier for the tensor (delayed or current
 * scaling), E4M3 / E5M2, and whether an element may clip (S: the clamp and the count). R: 1x128
 * row tiles along the stored rows, scales from the tile in registers. G: other tiles, scales
 * from a table (kernel T). SLOW: a uniform multiplier outside the fast path's range. */
enum { CLS_U4 = 0, CLS_U4S, CLS_U5, CLS_U5S, CLS_R4, CLS_R5, CLS_MX, CLS_G4, CLS_G5, CLS_SLOW };

/* the image specs as a kernel argument (by value) */
typedef struct {
    int n;
    int kind[ST_NIMG];
    int fmt[ST_NIMG]; /* element format (MX: E4M3) */
    int cls[ST_NIMG]; /* CLS_R4 ... CLS_G5 from the kind; -1: uniform (F1 decides) */
    const float *scale[ST_NIMG];
    float eps[ST_NIMG];
    int pow2[ST_NIMG];
    /* G images: tile shape, tiles per tile row, log2 of the sides (-1: not a power of two)
     * and the table [3][tiles]: multiplier, prescaled multiplier, its reciprocal */
    int tr[ST_NIMG], tc[ST_NIMG], nbc[ST_NIMG], shr[ST_NIMG], shc[ST_NIMG];
    float *gtab[ST_NIMG];
    size_t gtiles[ST_NIMG];
} img_specs;

/* what F1 leaves for T, P2, F2 and K */
typedef struct {
    double mean;
    float p, invp; /* prescale 2^k ~ 1/amax, and 2^-k (1 when tiny) */
    float mfp;     /* the mean rounded to float, times p: P2's deviations are from it, F2 takes
                      the shift out (not tiny) */
    int tiny;      /* amax < 2^-100: the image sums in double, q by IEEE division (below) */
    float amax;    /* over finite elements */
    float qamax;   /* as the quantizers take it: NaN if any, else Inf if any, else amax */
    int cls[ST_NIMG];
    float m[ST_NIMG];  /* uniform images: the multiplier (value = x * m) */
    float mp[ST_NIMG]; /* m / p, and its reciprocal rounded: the division q p = d / mp */
    float rp[ST_NIMG];
    float scale[ST_NIMG]; /* the per-tensor scale (NaN for block images); K uses it */
} stats_params;

/* ---------------------------------------------------------------------------------------- */
/* P1: moments */

typedef struct {
    ull nf, nnan, nzero; /* finite; NaN; zero or not finite (n_zero = nzero - (n - nf)) */
    float mn, mx, amax, minnz;
    double sum, sabs, ssq;
    double cmean, cm2; /* DEV: mean and sum (x - mean)^2 of the finite elements, merged by
                            Chan's pairwise formula (exact to double rounding, in one read) */
} mom_acc;

typedef struct {
    unsigned nf, nnan, nzero;
    float mn, mx, amax, minnz;
    double sum, sabs, ssq;
    double shift, s1, s2; /* DEV: sums of (x - shift) and its square, shift one of the
                             thread's own elements (so no cancellation beyond the data's) */
} mom_thr;

__device__ __forceinline__ void mom_thr_init(mom_thr *a) {
    a->nf = a->nnan = a->nzero = 0;
    a->mn = INFINITY, a->mx = -INFINITY, a->amax = 0.0f, a->minnz = INFINITY;
    a->sum = a->sabs = a->ssq = 0.0;
    a->shift = a->s1 = a->s2 = 0.0;
}

template <bool DEV> __device__ __forceinline__ void mom_elem(mom_thr *a, float v) {
    const bool fin = fabsf(v) < INFINITY; /* false for NaN and +-Inf */
    a->nnan += v != v;
    a->nf += fin;
    const float xs = fin ? v : 0.0f;
    const float vn = fin ? v : __int_as_float(0x7fffffff); /* NaN: fminf / fmaxf skip it */
    a->nzero += xs == 0.0f;
    a->mn = fminf(a->mn, vn);
    a->mx = fmaxf(a->mx, vn);
    a->amax = fmaxf(a->amax, fabsf(xs));
    a->minnz = fminf(a->minnz, xs != 0.0f ? fabsf(xs) : INFINITY);
    const double d = (double)xs;
    a->sum += d;
    a->sabs += fabs(d);
    a->ssq = fma(d, d, a->ssq);
    if (DEV) {
        const double dk = fin ? d - a->shift : 0.0;
        a->s1 += dk;
        a->s2 = fma(dk, dk, a->s2);
    }
}

/* Chan et al.'s pairwise update of (count, mean, M2); a->nf is still a's own count here */
__device__ __forceinline__ void mom_chan(mom_acc *a, const mom_acc *b) {
    if (b->nf == 0) return;
    if (a->nf == 0) {
        a->cmean = b->cmean, a->cm2 = b->cm2;
        return;
    }
    const double na = (double)a->nf, nb = (double)b->nf, n = na + nb;
    const double d = b->cmean - a->cmean;
    a->cmean += d * (nb / n);
    a->cm2 += b->cm2 + d * d * (na * nb / n);
}

__device__ __forceinline__ void mom_merge(mom_acc *a, const mom_acc *b) {
    mom_chan(a, b);
    a->nf += b->nf, a->nnan += b->nnan, a->nzero += b->nzero;
    a->mn = fminf(a->mn, b->mn), a->mx = fmaxf(a->mx, b->mx);
    a->amax = fmaxf(a->amax, b->amax), a->minnz = fminf(a->minnz, b->minnz);
    a->sum += b->sum, a->sabs += b->sabs, a->ssq += b->ssq;
}

__device__ __forceinline__ void mom_init(mom_acc *a) {
    a->nf = a->nnan = a->nzero = 0;
    a->mn = INFINITY, a->mx = -INFINITY, a->amax = 0.0f, a->minnz = INFINITY;
    a->sum = a->sabs = a->ssq = 0.0;
    a->cmean = a->cm2 = 0.0;
}

/* Fixed-order tree over the block's NT entries of sh; the result in sh[0]. */
template <typename T, void (*MERGE)(T *, const T *), int NT>
__device__ __forceinline__ void tree_reduce(T *sh) {
    for (int s = NT / 2; s > 0; s >>= 1) {
        __syncthreads();
        if ((int)threadIdx.x < s) MERGE(&sh[threadIdx.x], &sh[threadIdx.x + s]);
    }
    __syncthreads();
}

/* A thread's moments into the block's partial part[blockIdx.x], in the fixed tree. */
template <bool DEV>
__device__ __forceinline__ void p1_block_partial(mom_acc *part, mom_acc *sh, const mom_thr *a) {
    mom_acc b;
    b.nf = a->nf, b.nnan = a->nnan, b.nzero = a->nzero;
    b.mn = a->mn, b.mx = a->mx, b.amax = a->amax, b.minnz = a->minnz;
    b.sum = a->sum, b.sabs = a->sabs, b.ssq = a->ssq;
    b.cmean = b.cm2 = 0.0;
    if (DEV && a->nf > 0) {
        const double nf = (double)a->nf;
        b.cmean = a->shift + a->s1 / nf;
        b.cm2 = fmax(a->s2 - a->s1 * (a->s1 / nf), 0.0);
    }
    sh[threadIdx.x] = b;
    tree_reduce<mom_acc, mom_merge, ST_THREADS>(sh);
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

/* P1's element order is the same for a packed tensor and for rows in a wider buffer (row
 * stride ld > cols, read in place), and whatever x's alignment: thread i of T takes the
 * elements 4 i .. 4 i + 3 of the packed order, then 4 (i + T) .., then the last n % 4 one by
 * one (element 4 (n / 4) + i, + T ..). So a strided view and its packed copy sum in the same
 * order and give the same bits (the read-only inspect hook reads the head's logits in place,
 * the writing hook a packed copy). The walks below find where those elements are. */

/* packed: element e at x[e]; the thread's next group of 4 is `step` elements on */
struct p1_flat {
    size_t e, step;
    __device__ p1_flat(size_t e_, size_t step_, int, size_t) : e(e_), step(step_) {}
    /* vec: x 16-byte aligned */
    __device__ __forceinline__ float4 load4(const float *__restrict__ x, int vec) const {
        const float *p = x + e;
        if (vec) return *(const float4 *)p;
        return make_float4(p[0], p[1], p[2], p[3]);
    }
    __device__ __forceinline__ void next() { e += step; }
    __device__ __forceinline__ float at(const float *__restrict__ x, size_t i) const {
        return x[i];
    }
};

/* rows of cols elements ld apart: the thread's next group of 4 is `step` elements on, so its
 * row and column advance by a fixed (dr, dc) with one carry, no division per group */
struct p1_rows {
    size_t r, c, dr, dc, cols, ld;
    __device__ p1_rows(size_t e, size_t step, int cols_, size_t ld_)
        : r(e / (size_t)cols_), c(e % (size_t)cols_), dr(step / (size_t)cols_),
          dc(step % (size_t)cols_), cols((size_t)cols_), ld(ld_) {}
    /* vec: x aligned and ld, cols multiples of 4 (a group never crosses a row) */
    __device__ __forceinline__ float4 load4(const float *__restrict__ x, int vec) const {
        const float *p = x + r * ld + c;
        if (vec) return *(const float4 *)p;
        if (c + 4 <= cols) return make_float4(p[0], p[1], p[2], p[3]);
        float e[4]; /* the group runs into the next row(s) */
        size_t rr = r, cc = c;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            e[j] = x[rr * ld + cc];
            if (++cc == cols) cc = 0, rr++;
        }
        return make_float4(e[0], e[1], e[2], e[3]);
    }
    __device__ __forceinline__ void next() {
        c += dc, r += dr;
        if (c >= cols) c -= cols, r++;
    }
    __device__ __forceinline__ float at(const float *__restrict__ x, size_t e) const {
        return x[(e / cols) * ld + e % cols];
    }
};

/* vec: 4 elements per load (see the walks). DEV (a request without images): also the sum
 * (x - mean)^2, in this same read. */
template <bool DEV, typename WALK>
__global__ void __launch_bounds__(ST_THREADS)
    stats_p1_kernel(mom_acc *part, const float *__restrict__ x, size_t n, int vec, int cols,
                    size_t ld) {
    __shared__ mom_acc sh[ST_THREADS];
    mom_thr a;
    mom_thr_init(&a);
    const size_t T = (size_t)gridDim.x * ST_THREADS;
    const size_t i0 = (size_t)blockIdx.x * ST_THREADS + threadIdx.x;
    WALK w(4 * i0, 4 * T, cols, ld);
    if (DEV) { /* the shift: the first element this thread reads, if finite */
        const size_t t = 4 * i0 < 4 * (n / 4) ? 4 * i0 : 4 * (n / 4) + i0; /* group, or tail */
        const float k = t < n ? w.at(x, t) : 0.0f;
        a.shift = fabsf(k) < INFINITY ? (double)k : 0.0;
    }
    const size_t nv = n / 4;
    size_t i = i0;
    /* ST_P1_UNROLL independent loads in flight per thread */
    for (; i + (ST_P1_UNROLL - 1) * T < nv; i += ST_P1_UNROLL * T) {
        float4 v[ST_P1_UNROLL];
#pragma unroll
        for (int u = 0; u < ST_P1_UNROLL; u++) v[u] = w.load4(x, vec), w.next();
#pragma unroll
        for (int u = 0; u < ST_P1_UNROLL; u++) {
            mom_elem<DEV>(&a, v[u].x), mom_elem<DEV>(&a, v[u].y);
            mom_elem<DEV>(&a, v[u].z), mom_elem<DEV>(&a, v[u].w);
        }
    }
    for (; i < nv; i += T) {
        const float4 v = w.load4(x, vec);
        w.next();
        mom_elem<DEV>(&a, v.x), mom_elem<DEV>(&a, v.y), mom_elem<DEV>(&a, v.z),
            mom_elem<DEV>(&a, v.w);
    }
    for (size_t e = nv * 4 + i0; e < n; e += T) mom_elem<DEV>(&a, w.at(x, e));
    p1_block_partial<DEV>(part, sh, &a);
}

/* ---------------------------------------------------------------------------------------- */
/* F1: the moments into *out, the parameters of the images into *prm */

__device__ __forceinline__ int fmt_is_e5(int fmt) { return fmt == FP8_E5M2; }

__global__ void __launch_bounds__(ST_THREADS)
    stats_moments_finish(fp8t_stats_raw *out, stats_params *prm, const mom_acc *part, int nparts,
                         size_t n, img_specs sp) {
    __shared__ mom_acc sh[ST_THREADS];
    mom_acc a;
    mom_init(&a);
    for (int k = threadIdx.x; k < nparts; k += ST_THREADS) mom_merge(&a, &part[k]);
    sh[threadIdx.x] = a;
    /* *out from zero (what no kernel writes stays 0, as the CPU's memset leaves it) */
    for (size_t w = threadIdx.x; w < sizeof(fp8t_stats_raw) / sizeof(ull); w += ST_THREADS)
        ((ull *)out)[w] = 0;
    tree_reduce<mom_acc, mom_merge, ST_THREADS>(sh);
    if (threadIdx.x != 0) return;
    a = sh[0];
    const ull ninf = (ull)n - a.nf - a.nnan;
    out->n = n;
    out->n_finite = a.nf, out->n_nan = a.nnan, out->n_inf = ninf;
    out->n_zero = a.nzero - ((ull)n - a.nf);
    out->min = a.mn, out->max = a.mx, out->amax = a.amax, out->min_nonzero = a.minnz;
    out->sum = a.sum, out->sum_abs = a.sabs, out->sum_sq = a.ssq;
    if (sp.n == 0) out->dev_sq = a.cm2; /* P1<DEV> ran: no second read */
    out->n_images = sp.n;
    prm->mean = a.nf ? a.sum / (double)a.nf : 0.0;
    prm->amax = a.amax;
    const float qamax = a.nnan ? __int_as_float(0x7fc00000) : (ninf ? INFINITY : a.amax);
    prm->qamax = qamax;
    /* p = 2^k with p * amax in [1, 2) (k clamped so that p and 1/p are normal floats). A
     * tensor whose amax is below 2^-100 has every image value q a float subnormal or close to
     * one, where p q would not round as q does: there P2 takes q itself (p = 1), by IEEE
     * division, and sums in double. */
    const int tiny = a.amax > 0.0f && a.amax < 0x1p-100f;
    int k2 = 0;
    if (a.amax > 0.0f && !tiny) {
        k2 = -ilogbf(a.amax);
        k2 = k2 < -126 ? -126 : (k2 > 126 ? 126 : k2);
    }
    prm->tiny = tiny;
    const float p = ldexpf(1.0f, k2), invp = ldexpf(1.0f, -k2);
    prm->p = p, prm->invp = invp;
    prm->mfp = __fmul_rn(__double2float_rn(prm->mean), p);
    for (int k = 0; k < sp.n; k++) {
        float sc = __int_as_float(0x7fc00000);
        int cls = sp.cls[k];
        float mp = 0.0f, rp = 0.0f;
        if (sp.kind[k] == FP8T_IMG_SCALE || sp.kind[k] == FP8T_IMG_CURRENT) {
            const int e5 = fmt_is_e5(sp.fmt[k]);
            sc = sp.kind[k] == FP8T_IMG_SCALE
                     ? *sp.scale[k]
                     : fp8t_current_scale_of(qamax, e5 ? FP8_E5M2_MAX : FP8_E4M3_MAX, sp.eps[k],
                                             sp.pow2[k]);
            /* the fast path: sc, sc / p and its reciprocal normal floats */
            mp = __fmul_rn(sc, invp);
            rp = __frcp_rn(mp);
            int fast = isfinite(sc) && sc >= FLT_MIN && isfinite(mp) && mp >= FLT_MIN &&
                       isfinite(rp) && rp >= FLT_MIN;
            /* the largest |x * sc| is amax * sc (rounding is monotonic): may anything clip? */
            const float ymax = __fmul_rn(a.amax, sc);
            const int clip = e5 ? !(ymax < FP8T_CLIP_FROM_E5M2) : !(ymax <= FP8T_CLIP_ABOVE_E4M3);
            /* and the largest p q, which is that element's: a scale that clips nearly
             * everything by a factor beyond 2^40 makes every (p q)^2 a float subnormal (where
             * everything flushes to zero, q = 0 is exact either way) */
            if (fast && !tiny && a.amax > 0.0f) {
                int cl;
                const float qmp = __fdiv_rn(fp8t_round_clamp(ymax, e5, &cl), mp);
                fast = qmp == 0.0f || fabsf(qmp) >= 0x1p-40f;
            }
            cls = !fast ? CLS_SLOW : (e5 ? (clip ? CLS_U5S : CLS_U5) : (clip ? CLS_U4S : CLS_U4));
        }
        prm->cls[k] = cls;
        prm->m[k] = sc, prm->mp[k] = mp, prm->rp[k] = rp;
        prm->scale[k] = sc;
        out->img[k].scale = (double)sc;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* T: the table of a G image (tiles other than 1x128): per tile its current scale (NaN wins and
 * Inf counts in the tile's amax, either giving 1), the scale / p and the reciprocal of that */
__global__ void stats_gtable_kernel(float *tab, size_t ntiles, const stats_params *prm,
                                    const float *__restrict__ x, int rows, int cols, int tr,
                                    int tc, int fmt, int pow2) {
    const int nbc = (cols + tc - 1) / tc;
    const int br = (int)(blockIdx.x / nbc), bc = (int)(blockIdx.x % nbc);
    const int r0 = br * tr, c0 = bc * tc;
    const int nr = min(tr, rows - r0), nc = min(tc, cols - c0);
    const int cnt = nr * nc;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < cnt; i += blockDim.x)
        acc = amax_merge_dev(acc, x[(size_t)(r0 + i / nc) * cols + c0 + i % nc]);
    acc = block_amax(acc);
    if (threadIdx.x != 0) return;
    const float s =
        fp8t_current_scale_of(acc, fmt == FP8_E5M2 ? FP8_E5M2_MAX : FP8_E4M3_MAX, 0.0f, pow2);
    const float mp = fminf(__fmul_rn(s, prm->invp), FLT_MAX);
    tab[blockIdx.x] = s;
    tab[ntiles + blockIdx.x] = mp;
    tab[2 * ntiles + blockIdx.x] = __frcp_rn(mp);
}

/* ---------------------------------------------------------------------------------------- */
/* P2: deviations and the images */

/* the walk: flat (tiles of 128 consecutive elements; no block images) or rows (1x128 tiles of
 * each row, the last one of a row partial) */
typedef struct {
    int flat;
    size_t n;       /* elements */
    int rows, cols; /* rows mode */
    size_t ld; /* rows mode: the row stride of x (cols, or more for rows in a wider buffer) */
    int nbc;   /* tiles per row (rows mode) */
    size_t ntiles;
} p2_view;

typedef struct {
    double err, xq, qq;
    ull cz, sat, corr; /* FP8 values 0 (all elements; see the top), clipped, MX correction */
} img_part;

/* one image's sums over a lane's 4 x 4 elements, before they go into the thread's doubles */
typedef struct {
    double err, xq, qq;
    unsigned cz, sat;
} img_f;

/* The statistics of one image over the lane's elements xs[j][i] (tile j, x sanitized: 0 for
 * NaN, Inf and padding) with xp = p xs. m[j]: tile j's multiplier; the value q p =
 * d / mp[j] (Markstein with rp[j] = 1 / mp[j]) or, MULT, d * rp[j] (MXFP8: a power of two).
 * CLIP: the clamp to +-max and the count; else the caller knows |xs m| stays below the
 * clipping threshold. DBL (a tiny tensor: p = 1, mp = m): q = d / m by IEEE division and the
 * sums in double, where float squares would underflow. */
template <int E5, bool MULT, bool CLIP, bool DBL>
__device__ __forceinline__ void image_run(const float (&xs)[ST_U][4], const float (&xp)[ST_U][4],
                                          const float (&m)[ST_U], const float (&mp)[ST_U],
                                          const float (&rp)[ST_U], img_f *o) {
    unsigned cz = 0, cs = 0;
    if (!DBL) {
        float perr[ST_U], pxq[ST_U], pqq[ST_U];
#pragma unroll
        for (int j = 0; j < ST_U; j++) {
            perr[j] = pxq[j] = pqq[j] = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float y = __fmul_rn(xs[j][i], m[j]);
                float d;
                if (CLIP) {
                    int cl;
                    d = fp8t_round_clamp(y, E5, &cl);
                    cs += (unsigned)cl;
                } else {
                    d = fp8t_round_nosat(y, E5);
                }
                const float q = MULT ? __fmul_rn(d, rp[j]) : fp8t_div_markstein(d, mp[j], rp[j]);
                const float e = __fsub_rn(q, xp[j][i]);
                perr[j] = __fmaf_rn(e, e, perr[j]);
                pxq[j] = __fmaf_rn(xp[j][i], q, pxq[j]);
                pqq[j] = __fmaf_rn(q, q, pqq[j]);
                cz += d == 0.0f;
            }
        }
        o->err = (double)__fadd_rn(__fadd_rn(perr[0], perr[1]), __fadd_rn(perr[2], perr[3]));
        o->xq = (double)__fadd_rn(__fadd_rn(pxq[0], pxq[1]), __fadd_rn(pxq[2], pxq[3]));
        o->qq = (double)__fadd_rn(__fadd_rn(pqq[0], pqq[1]), __fadd_rn(pqq[2], pqq[3]));
    } else {
        double err = 0.0, xq = 0.0, qq = 0.0;
#pragma unroll
        for (int j = 0; j < ST_U; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float y = __fmul_rn(xs[j][i], m[j]);
                float d;
                if (CLIP) {
                    int cl;
                    d = fp8t_round_clamp(y, E5, &cl);
                    cs += (unsigned)cl;
                } else {
                    d = fp8t_round_nosat(y, E5);
                }
                const float q = MULT ? __fmul_rn(d, rp[j]) : __fdiv_rn(d, mp[j]);
                const double dq = (double)q, dx = (double)xs[j][i], e = dq - dx;
                err = fma(e, e, err);
                xq = fma(dx, dq, xq);
                qq = fma(dq, dq, qq);
                cz += d == 0.0f;
            }
        o->err = err, o->xq = xq, o->qq = qq;
    }
    o->cz = cz, o->sat = cs;
}

/* Tiles other than 1x128 (G): the multipliers per element from the table; always with the
 * clamp (a tile holding NaN or Inf has scale 1). */
template <int E5, bool DBL>
__device__ __forceinline__ void
image_run_table(const float (&xs)[ST_U][4], const float (&xp)[ST_U][4], const int (&row)[ST_U],
                const int (&c0)[ST_U], int lane, int cols, const img_specs &sp, int k, img_f *o) {
    const float *tab = sp.gtab[k];
    const size_t nt = sp.gtiles[k];
    float perr[ST_U], pxq[ST_U], pqq[ST_U];
    double derr = 0.0, dxq = 0.0, dqq = 0.0;
    unsigned cz = 0, cs = 0;
#pragma unroll
    for (int j = 0; j < ST_U; j++) {
        perr[j] = pxq[j] = pqq[j] = 0.0f;
        const int tro = sp.shr[k] >= 0 ? row[j] >> sp.shr[k] : row[j] / sp.tr[k];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int c = c0[j] + 4 * lane + i;
            c = c < cols ? c : cols - 1; /* padding (xs = 0): any tile will do */
            const int tco = sp.shc[k] >= 0 ? c >> sp.shc[k] : c / sp.tc[k];
            const size_t t = (size_t)tro * (size_t)sp.nbc[k] + (size_t)tco;
            const float mm = tab[t], mpp = tab[nt + t], rpp = tab[2 * nt + t];
            const float y = __fmul_rn(xs[j][i], mm);
            int cl;
            const float d = fp8t_round_clamp(y, E5, &cl);
            cs += (unsigned)cl;
            cz += d == 0.0f;
            if (DBL) { /* as image_run's */
                const double dq = (double)__fdiv_rn(d, mpp), dx = (double)xs[j][i], e = dq - dx;
                derr = fma(e, e, derr), dxq = fma(dx, dq, dxq), dqq = fma(dq, dq, dqq);
                continue;
            }
            const float q = fp8t_div_markstein(d, mpp, rpp);
            const float e = __fsub_rn(q, xp[j][i]);
            perr[j] = __fmaf_rn(e, e, perr[j]);
            pxq[j] = __fmaf_rn(xp[j][i], q, pxq[j]);
            pqq[j] = __fmaf_rn(q, q, pqq[j]);
        }
    }
    o->err =
        DBL ? derr : (double)__fadd_rn(__fadd_rn(perr[0], perr[1]), __fadd_rn(perr[2], perr[3]));
    o->xq = DBL ? dxq : (double)__fadd_rn(__fadd_rn(pxq[0], pxq[1]), __fadd_rn(pxq[2], pxq[3]));
    o->qq = DBL ? dqq : (double)__fadd_rn(__fadd_rn(pqq[0], pqq[1]), __fadd_rn(pqq[2], pqq[3]));
    o->cz = cz, o->sat = cs;
}

/* The slow class: the CPU's own steps per element (x read again; non-finite elements and
 * padding skipped), sums in double, the underflow count direct. */
__device__ __forceinline__ void image_run_slow(const float *__restrict__ x,
                                               const size_t (&off)[ST_U], const int (&len)[ST_U],
                                               int lane, float s, int fmt, double *err,
                                               double *xq, double *qq, unsigned *under,
                                               unsigned *sat) {
    const int e5 = fmt == FP8_E5M2;
#pragma unroll
    for (int j = 0; j < ST_U; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int c = 4 * lane + i;
            if (c >= len[j]) continue;
            const float v = x[off[j] + c];
            if (!(fabsf(v) < INFINITY)) continue;
            const float y = __fmul_rn(v, s);
            const float q = __fdiv_rn(fp8t_round_sat(y, e5), s);
            const double dv = v, qv = q, e = qv - dv;
            *err = fma(e, e, *err);
            *xq = fma(dv, qv, *xq);
            *qq = fma(qv, qv, *qq);
            *under += v != 0.0f && q == 0.0f;
            *sat += y == y && (e5 ? !(fabsf(y) < FP8T_CLIP_FROM_E5M2)
                                  : !(fabsf(y) <= FP8T_CLIP_ABOVE_E4M3));
        }
}

/* P2's tiles t .. t + ST_U - 1 ((r, bc): t's row and tile column in rows mode): where each
 * starts in x, its length (0 past the end), and its row and first column for the G tables */
__device__ __forceinline__ void p2_tiles(const p2_view &v, size_t t, int r, int bc,
                                         size_t (&off)[ST_U], int (&len)[ST_U], int (&row)[ST_U],
                                         int (&c0)[ST_U]) {
#pragma unroll
    for (int j = 0; j < ST_U; j++) {
        const size_t tj = t + (size_t)j;
        if (v.flat) {
            off[j] = tj * ST_TILE;
            len[j] = tj < v.ntiles ? (int)min((size_t)ST_TILE, v.n - off[j]) : 0;
            row[j] = 0, c0[j] = 0;
        } else {
            /* a tile past the end (len 0) is all padding; its row stays in range for the G
             * tables' index */
            row[j] = r < v.rows ? r : v.rows - 1, c0[j] = bc * ST_TILE;
            off[j] = (size_t)r * v.ld + (size_t)c0[j];
            len[j] = tj < v.ntiles ? min(ST_TILE, v.cols - c0[j]) : 0;
            if (++bc == v.nbc) bc = 0, r++;
        }
    }
}

/* a lane's 4 columns of each tile; padding is NaN (sanitized to 0 by the caller) */
__device__ __forceinline__ void p2_load(const float *__restrict__ x, int vec, int lane,
                                        const size_t (&off)[ST_U], const int (&len)[ST_U],
                                        float (&e)[ST_U][4]) {
    const float nanf_ = __int_as_float(0x7fffffff);
    const int c = 4 * lane;
#pragma unroll
    for (int j = 0; j < ST_U; j++) {
        if (vec && c + 3 < len[j]) {
            const float4 f = *(const float4 *)(x + off[j] + c);
            e[j][0] = f.x, e[j][1] = f.y, e[j][2] = f.z, e[j][3] = f.w;
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) e[j][i] = c + i < len[j] ? x[off[j] + c + i] : nanf_;
        }
    }
}

/* TINY: the kernel for tensors with amax < 2^-100 (prm->tiny); both are launched and the one
 * that does not match returns at once, so the host never waits for the amax */
template <bool TINY>
__global__ void __launch_bounds__(ST_P2_THREADS, ST_P2_MINB)
    stats_p2_kernel(img_part *part, double *dev_part, const stats_params *prm,
                    const float *__restrict__ x, p2_view v, img_specs sp, int vec) {
    if (prm->tiny != (int)TINY) return;
    /* per thread and image: err, xq, qq (double); FP8 zeros, clipped, MX correction */
    __shared__ double s_acc[ST_NIMG * 3 * ST_P2_THREADS];
    __shared__ unsigned s_cnt[ST_NIMG * 3 * ST_P2_THREADS];
    __shared__ int s_cls[ST_NIMG];
    __shared__ float s_m[ST_NIMG], s_mp[ST_NIMG], s_rp[ST_NIMG];
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nimg = sp.n;
    if (tid < nimg) {
        s_cls[tid] = prm->cls[tid];
        s_m[tid] = prm->m[tid], s_mp[tid] = prm->mp[tid], s_rp[tid] = prm->rp[tid];
    }
    for (int i = tid; i < nimg * 3 * ST_P2_THREADS; i += ST_P2_THREADS)
        s_acc[i] = 0.0, s_cnt[i] = 0;
    __syncthreads();
    int need_r = 0, need_mx = 0;
    for (int k = 0; k < nimg; k++) {
        need_r |= s_cls[k] == CLS_R4 || s_cls[k] == CLS_R5;
        need_mx |= s_cls[k] == CLS_MX;
    }
    const double mean = prm->mean;
    const float p = prm->p, invp = prm->invp;
    const float nanf_ = __int_as_float(0x7fffffff);
    double dev = 0.0;
    /* the deviations from the mean rounded to float, prescaled; F2 takes out the shift (see
     * the top). TINY: from the mean itself, in double. */
    const float mfp = prm->mfp;

    /* tiles t = (it * W + w) * U + j: the warp's U consecutive tiles per iteration */
    const size_t W = (size_t)gridDim.x * ST_P2_WARPS;
    const size_t step = W * ST_U;
    size_t t = ((size_t)blockIdx.x * ST_P2_WARPS + (size_t)warp) * ST_U;
    /* rows mode: (row, tile column) of t, and of the step */
    int r = 0, bc = 0, dr = 0, dc = 0;
    if (!v.flat) {
        r = (int)(t / (size_t)v.nbc), bc = (int)(t % (size_t)v.nbc);
        dr = (int)(step / (size_t)v.nbc), dc = (int)(step % (size_t)v.nbc);
    }
    for (; t < v.ntiles; t += step) {
        size_t off[ST_U];
        int len[ST_U], row[ST_U], c0[ST_U];
        p2_tiles(v, t, r, bc, off, len, row, c0);
        float e[ST_U][4];
        p2_load(x, vec, lane, off, len, e);
        float xs[ST_U][4], xp[ST_U][4];
        unsigned lane_bad = 0, lane_fin = 0; /* bit j: tile j's 4 elements of this lane */
        float pdev[ST_U]; /* this lane's squared deviations per tile (prescaled) */
#pragma unroll
        for (int j = 0; j < ST_U; j++) {
            const int c = 4 * lane;
            pdev[j] = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const bool fin = fabsf(e[j][i]) < INFINITY; /* false for padding (NaN) too */
                xs[j][i] = fin ? e[j][i] : 0.0f;
                xp[j][i] = __fmul_rn(xs[j][i], p);
                if (!TINY) {
                    const float dd = fin ? __fsub_rn(xp[j][i], mfp) : 0.0f;
                    pdev[j] = __fmaf_rn(dd, dd, pdev[j]);
                } else {
                    const double dd = fin ? (double)xs[j][i] - mean : 0.0;
                    dev = fma(dd, dd, dev);
                }
                lane_fin |= (unsigned)fin << j;
                lane_bad |= (unsigned)(!fin && c + i < len[j]) << j;
            }
        }
        if (!TINY)
            dev += (double)__fadd_rn(__fadd_rn(pdev[0], pdev[1]), __fadd_rn(pdev[2], pdev[3]));

        /* the row tiles' amaxes: lane l holds columns 4l..4l+3, so xor 1, 2, 4 give the amax of
         * its MX block of 32 and xor 8, 16 the tile's */
        float ta[ST_U] = {0}, ga[ST_U] = {0};
        unsigned tbad = 0, gbad = 0, gfin = 0; /* bit j: tile j / this lane's MX block */
        if (need_r || need_mx) {
#pragma unroll
            for (int j = 0; j < ST_U; j++) {
                float a = fmaxf(fmaxf(fabsf(xs[j][0]), fabsf(xs[j][1])),
                                fmaxf(fabsf(xs[j][2]), fabsf(xs[j][3])));
                a = fmaxf(a, __shfl_xor_sync(ST_FULL, a, 1));
                a = fmaxf(a, __shfl_xor_sync(ST_FULL, a, 2));
                a = fmaxf(a, __shfl_xor_sync(ST_FULL, a, 4));
                ga[j] = a;
                a = fmaxf(a, __shfl_xor_sync(ST_FULL, a, 8));
                a = fmaxf(a, __shfl_xor_sync(ST_FULL, a, 16));
                ta[j] = a;
                const unsigned bb = __ballot_sync(ST_FULL, lane_bad >> j & 1u);
                tbad |= (unsigned)(bb != 0) << j;
                gbad |= (unsigned)((bb >> (lane & 24) & 0xffu) != 0) << j;
            }
            if (tbad) { /* rare: which bad MX blocks hold a finite element */
#pragma unroll
                for (int j = 0; j < ST_U; j++) {
                    const unsigned fb = __ballot_sync(ST_FULL, lane_fin >> j & 1u);
                    gfin |= (unsigned)((fb >> (lane & 24) & 0xffu) != 0) << j;
                }
            }
        }
        /* 1x128 scales: lane j < U computes tile j's (the divisions once per tile) */
        float s4 = 1.0f, mp4 = 1.0f, rp4 = 1.0f, s5 = 1.0f, mp5 = 1.0f, rp5 = 1.0f;
        if (need_r) {
            const int jl = lane & (ST_U - 1);
            const float a = jl == 0 ? ta[0] : jl == 1 ? ta[1] : jl == 2 ? ta[2] : ta[3];
            const int bad = tbad >> jl & 1u;
            const float aq = bad ? nanf_ : a;
            s4 = fp8t_current_scale_of(aq, FP8_E4M3_MAX, 0.0f, 0);
            /* 57344 / a = 128 * (448 / a): the same rounding while both are normal */
            s5 = !bad && a > 0.0f && s4 < 0x1p120f
                     ? s4 * 128.0f
                     : fp8t_current_scale_of(aq, FP8_E5M2_MAX, 0.0f, 0);
            mp4 = fminf(__fmul_rn(s4, invp), FLT_MAX), rp4 = __frcp_rn(mp4);
            mp5 = fminf(__fmul_rn(s5, invp), FLT_MAX), rp5 = __frcp_rn(mp5);
        }
        /* MXFP8: this lane's block of each tile, 2^-e and p 2^e; a block holding NaN or Inf is
         * NaN in every element (multiplier NaN), or contributes nothing when it holds no
         * finite element (multiplier 0) */
        float mxm[ST_U], mxr[ST_U];
        unsigned mxcorr = 0; /* zeros of this lane in NaN blocks, which cz missed */
        if (need_mx) {
#pragma unroll
            for (int j = 0; j < ST_U; j++) {
                const int eb = fp8t_mx_exponent_bits(ga[j]);
                const float mm = __uint_as_float((unsigned)(254 - eb) << 23);
                const float rr = eb ? __uint_as_float((unsigned)eb << 23)
                                    : __uint_as_float(0x00400000u); /* 2^-127 */
                mxm[j] = mm, mxr[j] = __fmul_rn(rr, p);
                if (gbad >> j & 1u) {
                    const int f = gfin >> j & 1u;
                    mxm[j] = mxr[j] = f ? nanf_ : 0.0f;
                    if (f)
                        mxcorr += (xs[j][0] == 0.0f) + (xs[j][1] == 0.0f) + (xs[j][2] == 0.0f) +
                                  (xs[j][3] == 0.0f);
                }
            }
        }

        for (int k = 0; k < nimg; k++) {
            const int cls = s_cls[k];
            img_f o;
            o.err = o.xq = o.qq = 0.0;
            o.cz = o.sat = 0;
            unsigned corr = 0;
            /* uniform and 1x128 images share image_run's four bodies (one copy of each in the
             * loop: the kernel's hot code is what the instruction cache holds) */
            if (cls <= CLS_R5) {
                float mt[ST_U], mpt[ST_U], rpt[ST_U];
                int e5, clip;
                if (cls <= CLS_U5S) {
                    const float mu = s_m[k], mpu = s_mp[k], rpu = s_rp[k];
#pragma unroll
                    for (int j = 0; j < ST_U; j++) mt[j] = mu, mpt[j] = mpu, rpt[j] = rpu;
                    e5 = cls >= CLS_U5, clip = cls == CLS_U4S || cls == CLS_U5S;
                } else {
                    e5 = cls == CLS_R5;
                    clip = tbad != 0; /* a tile with NaN / Inf has scale 1: it may clip */
#pragma unroll
                    for (int j = 0; j < ST_U; j++) {
                        mt[j] = __shfl_sync(ST_FULL, e5 ? s5 : s4, j);
                        mpt[j] = __shfl_sync(ST_FULL, e5 ? mp5 : mp4, j);
                        rpt[j] = __shfl_sync(ST_FULL, e5 ? rp5 : rp4, j);
                    }
                }
                if (e5) {
                    if (clip)
                        image_run<1, false, true, TINY>(xs, xp, mt, mpt, rpt, &o);
                    else
                        image_run<1, false, false, TINY>(xs, xp, mt, mpt, rpt, &o);
                } else {
                    if (clip)
                        image_run<0, false, true, TINY>(xs, xp, mt, mpt, rpt, &o);
                    else
                        image_run<0, false, false, TINY>(xs, xp, mt, mpt, rpt, &o);
                }
            } else if (cls == CLS_MX) {
                image_run<0, true, false, TINY>(xs, xp, mxm, mxm, mxr, &o);
                corr = mxcorr;
            } else if (cls == CLS_G4) {
                image_run_table<0, TINY>(xs, xp, row, c0, lane, v.cols, sp, k, &o);
            } else if (cls == CLS_G5) {
                image_run_table<1, TINY>(xs, xp, row, c0, lane, v.cols, sp, k, &o);
            } else { /* CLS_SLOW: straight into the doubles */
                const int b = k * 3 * ST_P2_THREADS + tid;
                double e = 0.0, xq = 0.0, qq = 0.0;
                unsigned un = 0, sa = 0;
                image_run_slow(x, off, len, lane, s_m[k], sp.fmt[k], &e, &xq, &qq, &un, &sa);
                s_acc[b] += e, s_acc[b + ST_P2_THREADS] += xq;
                s_acc[b + 2 * ST_P2_THREADS] += qq;
                s_cnt[b] += un, s_cnt[b + ST_P2_THREADS] += sa;
                continue;
            }
            const int b = k * 3 * ST_P2_THREADS + tid;
            s_acc[b] += o.err;
            s_acc[b + ST_P2_THREADS] += o.xq;
            s_acc[b + 2 * ST_P2_THREADS] += o.qq;
            s_cnt[b] += o.cz;
            s_cnt[b + ST_P2_THREADS] += o.sat;
            s_cnt[b + 2 * ST_P2_THREADS] += corr;
        }
        if (!v.flat) {
            bc += dc, r += dr;
            if (bc >= v.nbc) bc -= v.nbc, r++;
        }
    }

    /* the block's sums, in a fixed tree */
    __shared__ double s_dev[ST_P2_THREADS];
    s_dev[tid] = dev;
    for (int s = ST_P2_THREADS / 2; s > 0; s >>= 1) {
        __syncthreads();
        if (tid < s) {
            s_dev[tid] += s_dev[tid + s];
            for (int k = 0; k < nimg; k++)
                for (int f = 0; f < 3; f++) {
                    const int b = (k * 3 + f) * ST_P2_THREADS + tid;
                    s_acc[b] += s_acc[b + s];
                    s_cnt[b] += s_cnt[b + s];
                }
        }
    }
    __syncthreads();
    if (tid == 0) dev_part[blockIdx.x] = s_dev[0];
    if (tid < nimg) {
        const int b = tid * 3 * ST_P2_THREADS;
        img_part o;
        o.err = s_acc[b], o.xq = s_acc[b + ST_P2_THREADS], o.qq = s_acc[b + 2 * ST_P2_THREADS];
        o.cz = s_cnt[b], o.sat = s_cnt[b + ST_P2_THREADS], o.corr = s_cnt[b + 2 * ST_P2_THREADS];
        part[(size_t)blockIdx.x * ST_NIMG + tid] = o;
    }
}

__device__ __forceinline__ void dbl_add(double *a, const double *b) { *a += *b; }

__device__ __forceinline__ void img_part_merge(img_part *a, const img_part *b) {
    a->err += b->err, a->xq += b->xq, a->qq += b->qq;
    a->cz += b->cz, a->sat += b->sat, a->corr += b->corr;
}

/* F2: P2's partials in index order into *out. slots: the element slots P2 walked (elements and
 * padding, each an FP8 zero where x is sanitized to 0) */
__global__ void __launch_bounds__(ST_THREADS)
    stats_images_finish(fp8t_stats_raw *out, const stats_params *prm, const img_part *part,
                        const double *dev_part, int nparts, int nimg, ull slots) {
    __shared__ img_part sh[ST_THREADS];
    __shared__ double shd[ST_THREADS];
    const double ip2 = (double)prm->invp * (double)prm->invp;
    double dev = 0.0;
    for (int q = threadIdx.x; q < nparts; q += ST_THREADS) dev += dev_part[q];
    shd[threadIdx.x] = dev;
    tree_reduce<double, dbl_add, ST_THREADS>(shd);
    if (threadIdx.x == 0) {
        /* sum (x - mean)^2 = sum (x - m)^2 - nf (mean - m)^2, m = mfp / p (not tiny) */
        const double shift = prm->mean - (double)prm->mfp * (double)prm->invp;
        out->dev_sq =
            prm->tiny ? shd[0] : fmax(shd[0] * ip2 - (double)out->n_finite * shift * shift, 0.0);
    }
    /* every slot whose x is 0 after sanitizing (zeros, NaN, Inf, padding) is an FP8 zero in
     * every image but the slow class and the MX NaN blocks (corr) */
    const ull zeros = out->n_zero + (out->n - out->n_finite) + (slots - out->n);
    for (int k = 0; k < nimg; k++) {
        img_part a;
        a.err = a.xq = a.qq = 0.0;
        a.cz = a.sat = a.corr = 0;
        for (int q = threadIdx.x; q < nparts; q += ST_THREADS)
            img_part_merge(&a, &part[(size_t)q * ST_NIMG + k]);
        sh[threadIdx.x] = a;
        tree_reduce<img_part, img_part_merge, ST_THREADS>(sh);
        if (threadIdx.x == 0) {
            fp8t_image_raw *ir = &out->img[k];
            const int slow = prm->cls[k] == CLS_SLOW;
            ir->n_underflow = slow ? sh[0].cz : sh[0].cz + sh[0].corr - zeros;
            ir->n_sat = sh[0].sat;
            const double f = slow ? 1.0 : ip2;
            ir->err_sq = sh[0].err * f, ir->xq = sh[0].xq * f, ir->qq = sh[0].qq * f;
        }
        __syncthreads();
    }
}

/* ---------------------------------------------------------------------------------------- */
/* K, K2: block=N statistics at the per-tensor multiplier of image bimg */

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
    const int e5 = fmt == FP8_E5M2;
    size_t lo = (size_t)blockIdx.x * bs, hi = lo + bs < n ? lo + bs : n;
    blk_acc a = {0.0f, 0, 0, 0.0, 0.0};
    for (size_t i = lo + threadIdx.x; i < hi; i += ST_THREADS) {
        float v = x[i];
        if (!isfinite(v)) continue;
        float q = __fdiv_rn(fp8t_round_sat(__fmul_rn(v, m), e5), m);
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
    tree_reduce<blk_acc, blk_merge, ST_THREADS>(sh);
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
    tree_reduce<blk_sum, blk_sum_merge, ST_THREADS>(sh);
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

/* ---------------------------------------------------------------------------------------- */
/* tile_stats: each tile of image 0 (TILES: the block / rowwise GEMMs' own image) on its own,
 * one block per tile (its amax and current scale, then each element's image as the CPU makes
 * it: decode(encode(v s)) / s), then one block summarizing them in tile order (the CPU's
 * ordered scan: the first tile of the lowest SQNR and of the highest underflow) */
__global__ void __launch_bounds__(ST_THREADS)
    stats_tile_errors_kernel(fp8t_block_raw *list, const float *__restrict__ x, int rows,
                             int cols, int tr, int tc, int fmt, int pow2) {
    __shared__ blk_acc sh[ST_THREADS];
    __shared__ float s_m;
    const int nbc = (cols + tc - 1) / tc;
    const int r0 = (int)(blockIdx.x / nbc) * tr, c0 = (int)(blockIdx.x % nbc) * tc;
    const int nr = min(tr, rows - r0), nc = min(tc, cols - c0);
    const int e5 = fmt == FP8_E5M2;
    float am = 0.0f;
    for (int i = threadIdx.x; i < nr * nc; i += ST_THREADS)
        am = amax_merge_dev(am, x[(size_t)(r0 + i / nc) * cols + c0 + i % nc]);
    am = block_amax(am);
    if (threadIdx.x == 0)
        s_m = fp8t_current_scale_of(am, e5 ? FP8_E5M2_MAX : FP8_E4M3_MAX, 0.0f, pow2);
    __syncthreads();
    const float m = s_m;
    blk_acc a = {0.0f, 0, 0, 0.0, 0.0};
    for (int i = threadIdx.x; i < nr * nc; i += ST_THREADS) {
        const float v = x[(size_t)(r0 + i / nc) * cols + c0 + i % nc];
        if (!isfinite(v)) continue;
        const float q = __fdiv_rn(fp8t_round_sat(__fmul_rn(v, m), e5), m);
        const double dv = (double)v, e = (double)q - dv;
        a.xx += dv * dv;
        a.err += e * e;
        if (v != 0.0f) {
            a.nonzero++;
            a.under += q == 0.0f;
        }
    }
    sh[threadIdx.x] = a;
    tree_reduce<blk_acc, blk_merge, ST_THREADS>(sh);
    if (threadIdx.x == 0) {
        fp8t_block_raw r;
        r.amax = 0.0;
        r.sqnr_db = sqnr_dev(sh[0].xx, sh[0].err);
        r.underflow_pct =
            sh[0].nonzero ? 100.0 * (double)sh[0].under / (double)sh[0].nonzero : 0.0;
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
    tree_reduce<tile_sum, tile_sum_merge, ST_THREADS>(sh);
    if (threadIdx.x == 0) {
        out->n_tiles = nt;
        out->tile_sqnr_min_db = sh[0].sq_min;
        out->tile_sqnr_min_index = sh[0].sq_idx == ~0ull ? 0 : sh[0].sq_idx;
        out->tile_underflow_max_pct = sh[0].up_max;
        out->tile_underflow_max_index = sh[0].up_idx == ~0ull ? 0 : sh[0].up_idx;
        out->tiles_with_underflow = sh[0].with_under;
    }
}

/* ---------------------------------------------------------------------------------------- */

/* Blocks of a grid-stride kernel: enough for the work, at most as many as the GPU keeps
 * resident at once (a larger grid would run its last blocks as a second, mostly idle wave). */
static unsigned st_grid(const cuda_state *s, const void *kernel, int threads,
                        std::atomic<int> *occ, size_t want) {
    /* asked once per kernel (a function of the kernel and the architecture; a few us a call,
     * and an inspected step makes hundreds) */
    int per_sm = occ->load(std::memory_order_relaxed);
    if (per_sm <= 0) {
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
        occ->store(per_sm, std::memory_order_relaxed);
    }
    const size_t cap = (size_t)s->num_sms * (size_t)(per_sm > 0 ? per_sm : 1);
    if (want < 1) want = 1;
    return (unsigned)(want < cap ? want : cap);
}

/* P1 over x in WALK's layout; dev: a request without images (the deviations in this read) */
template <typename WALK>
static void p1_launch(const cuda_state *s, unsigned grid, mom_acc *part, const float *x, size_t n,
                      int vec, int cols, int ld, int dev) {
    if (dev)
        stats_p1_kernel<true, WALK>
            <<<grid, ST_THREADS, 0, s->stream>>>(part, x, n, vec, cols, (size_t)ld);
    else
        stats_p1_kernel<false, WALK>
            <<<grid, ST_THREADS, 0, s->stream>>>(part, x, n, vec, cols, (size_t)ld);
}

/* Whether a request reads x in a kernel that walks it packed (the tile tables of kernel T,
 * the consecutive blocks of block=N, the per-tile errors): rows in a wider buffer are packed
 * for it first. P1 and P2 read strided rows themselves. */
static int stats_reads_packed(const fp8t_stats_req *req, int nimg) {
    if (req->block > 0 || req->tile_stats) return 1;
    for (int k = 0; k < nimg; k++) {
        const fp8t_image_spec *is = &req->img[k];
        if (is->kind == FP8T_IMG_TILES &&
            !(is->tile_r == 1 && is->tile_c == ST_TILE && !is->pow2))
            return 1;
    }
    return 0;
}

void cuda_tensor_stats(fp8t_backend *b, fp8t_stats_raw *out, const float *x, int rows, int cols,
                       const fp8t_stats_req *req) {
    cuda_state *s = cuda_of(b);
    static_assert(sizeof(fp8t_stats_raw) % sizeof(ull) == 0, "F1 zeroes *out in 8-byte words");
    const size_t n = rows > 0 && cols > 0 ? (size_t)rows * (size_t)cols : 0;
    const int ld = req && req->ld > 0 ? req->ld : cols;
    if (ld < cols) {
        FP8T_FATAL("tensor_stats: row stride %d is less than the %d columns", ld, cols);
    }
    int nimg = req ? req->n_images : 0;
    if (nimg > ST_NIMG) nimg = ST_NIMG;
    if (nimg < 0 || n == 0) nimg = 0;
    const int strided = ld != cols && n > 0;
    if (strided && stats_reads_packed(req, nimg)) {
        float *packed_x = (float *)cuda_scratch(b, SCR_STATS_PACK, n * sizeof(float));
        CUDA_CHECK(cudaMemcpy2DAsync(packed_x, (size_t)cols * sizeof(float), x,
                                     (size_t)ld * sizeof(float), (size_t)cols * sizeof(float),
                                     (size_t)rows, cudaMemcpyDeviceToDevice, s->stream));
        fp8t_stats_req packed = *req;
        packed.ld = 0;
        cuda_tensor_stats(b, out, packed_x, rows, cols, &packed);
        return;
    }
    img_specs sp;
    memset(&sp, 0, sizeof sp);
    sp.n = nimg;
    int rows_mode = 0;
    for (int k = 0; k < nimg; k++) {
        const fp8t_image_spec *is = &req->img[k];
        sp.kind[k] = is->kind;
        sp.fmt[k] = is->kind == FP8T_IMG_MX ? FP8_E4M3 : is->fmt;
        sp.scale[k] = is->scale;
        sp.eps[k] = is->epsilon;
        sp.pow2[k] = is->pow2;
        sp.cls[k] = -1;
        const int e5 = sp.fmt[k] == FP8_E5M2;
        if (is->kind == FP8T_IMG_MX) {
            sp.cls[k] = CLS_MX;
            rows_mode = 1;
        } else if (is->kind == FP8T_IMG_TILES) {
            const int tr = is->tile_r, tc = is->tile_c;
            if (tr <= 0 || tc <= 0) {
                FP8T_FATAL("tensor_stats: image %d has tile %dx%d (must be positive)", k, tr, tc);
            }
            rows_mode = 1;
            /* power-of-two tile scales (the block / rowwise recipes' option) take the table */
            if (tr == 1 && tc == ST_TILE && !is->pow2) {
                sp.cls[k] = e5 ? CLS_R5 : CLS_R4;
            } else {
                sp.cls[k] = e5 ? CLS_G5 : CLS_G4;
                sp.tr[k] = tr, sp.tc[k] = tc;
                sp.shr[k] = (tr & (tr - 1)) ? -1 : __builtin_ctz((unsigned)tr);
                sp.shc[k] = (tc & (tc - 1)) ? -1 : __builtin_ctz((unsigned)tc);
                sp.nbc[k] = (cols + tc - 1) / tc;
                sp.gtiles[k] = (size_t)((rows + tr - 1) / tr) * (size_t)sp.nbc[k];
            }
        } else if (is->kind == FP8T_IMG_SCALE && !is->scale) {
            FP8T_FATAL("tensor_stats: image %d (SCALE) has no scale pointer", k);
        }
    }
    /* P2's walk: the rows when an image has tiles, else 128 consecutive elements at a time */
    p2_view v;
    memset(&v, 0, sizeof v);
    v.n = n;
    rows_mode = rows_mode || strided; /* the flat walk reads packed elements */
    v.flat = !rows_mode;
    if (rows_mode) {
        v.rows = rows, v.cols = cols, v.ld = (size_t)ld;
        v.nbc = (int)cdiv_u((size_t)cols, ST_TILE);
        v.ntiles = (size_t)rows * (size_t)v.nbc;
    } else {
        v.ntiles = (n + ST_TILE - 1) / ST_TILE;
    }
    const int aligned = ((uintptr_t)x & 15u) == 0;
    const int vec2 = aligned && (v.flat || ld % 4 == 0);

    static std::atomic<int> occ1(0), occ2(0);
    const unsigned grid1 = st_grid(s, (const void *)stats_p1_kernel<true, p1_flat>, ST_THREADS,
                                   &occ1, cdiv_u(n, (size_t)ST_THREADS * 4 * ST_P1_UNROLL));
    /* the partial buffers are sized by the common kernel's grid; the tiny one runs as many */
    const unsigned grid2 = st_grid(s, (const void *)stats_p2_kernel<false>, ST_P2_THREADS, &occ2,
                                   cdiv_u(v.ntiles, (size_t)ST_P2_WARPS * ST_U));
    /* scratch: P1 partials | params | P2 partials | P2's dev partials | G tables... | block list */
    const size_t off_par = align_up(grid1 * sizeof(mom_acc), 256);
    const size_t off_p2 = off_par + align_up(sizeof(stats_params), 256);
    const size_t off_dev = off_p2 + align_up((size_t)grid2 * ST_NIMG * sizeof(img_part), 256);
    size_t end = off_dev + align_up((size_t)grid2 * sizeof(double), 256);
    size_t tab_off[ST_NIMG] = {0};
    for (int k = 0; k < nimg; k++)
        if (sp.gtiles[k]) {
            tab_off[k] = end;
            end += align_up(3 * sp.gtiles[k] * sizeof(float), 256);
        }
    size_t nb = 0;
    const size_t off_list = end;
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
    const int tstats = req && nimg > 0 && req->tile_stats && req->img[0].kind == FP8T_IMG_TILES;
    size_t ntl = 0;
    const size_t off_tlist = end;
    if (tstats) {
        const int tr = req->img[0].tile_r, tc = req->img[0].tile_c;
        ntl = (size_t)((rows + tr - 1) / tr) * (size_t)((cols + tc - 1) / tc);
        end += align_up(ntl * sizeof(fp8t_block_raw), 256);
    }
    char *scr = (char *)cuda_scratch(b, SCR_STATS, end);
    mom_acc *part1 = (mom_acc *)scr;
    stats_params *prm = (stats_params *)(scr + off_par);
    img_part *part2 = (img_part *)(scr + off_p2);
    double *devp = (double *)(scr + off_dev);
    for (int k = 0; k < nimg; k++)
        if (sp.gtiles[k]) sp.gtab[k] = (float *)(scr + tab_off[k]);

    if (strided)
        p1_launch<p1_rows>(s, grid1, part1, x, n, aligned && ld % 4 == 0 && cols % 4 == 0, cols,
                           ld, nimg == 0);
    else
        p1_launch<p1_flat>(s, grid1, part1, x, n, aligned, cols, ld, nimg == 0);
    CUDA_LAUNCH_CHECK(s);
    stats_moments_finish<<<1, ST_THREADS, 0, s->stream>>>(out, prm, part1, (int)grid1, n, sp);
    CUDA_LAUNCH_CHECK(s);
    for (int k = 0; k < nimg; k++) {
        if (!sp.gtiles[k]) continue;
        const int cnt = sp.tr[k] * sp.tc[k];
        stats_gtable_kernel<<<(unsigned)sp.gtiles[k], cnt >= 1024 ? 256 : (cnt > 32 ? 128 : 32),
                              0, s->stream>>>(sp.gtab[k], sp.gtiles[k], prm, x, rows, cols,
                                              sp.tr[k], sp.tc[k], sp.fmt[k], sp.pow2[k]);
        CUDA_LAUNCH_CHECK(s);
    }
    if (nimg > 0) {
        stats_p2_kernel<false>
            <<<grid2, ST_P2_THREADS, 0, s->stream>>>(part2, devp, prm, x, v, sp, vec2);
        CUDA_LAUNCH_CHECK(s);
        stats_p2_kernel<true>
            <<<grid2, ST_P2_THREADS, 0, s->stream>>>(part2, devp, prm, x, v, sp, vec2);
        CUDA_LAUNCH_CHECK(s);
        /* the slots P2 walks: the tiles t < ntiles each warp starts at (every multiple of U
         * below ntiles, once), U tiles each, those past the end as padding */
        const ull slots = (ull)((v.ntiles + ST_U - 1) / ST_U) * ST_U * ST_TILE;
        stats_images_finish<<<1, ST_THREADS, 0, s->stream>>>(out, prm, part2, devp, (int)grid2,
                                                             nimg, slots);
        CUDA_LAUNCH_CHECK(s);
    }
    if (bs > 0) {
        fp8t_block_raw *list =
            req->block_list ? req->block_list : (fp8t_block_raw *)(scr + off_list);
        stats_blocks_kernel<<<(unsigned)nb, ST_THREADS, 0, s->stream>>>(
            list, prm, x, n, (size_t)bs, req->block_img, sp.fmt[req->block_img]);
        CUDA_LAUNCH_CHECK(s);
        stats_blocks_finish<<<1, ST_THREADS, 0, s->stream>>>(out, list, nb, bs);
        CUDA_LAUNCH_CHECK(s);
    }
    if (tstats) {
        fp8t_block_raw *tl = (fp8t_block_raw *)(scr + off_tlist);
        stats_tile_errors_kernel<<<(unsigned)ntl, ST_THREADS, 0, s->stream>>>(
            tl, x, rows, cols, req->img[0].tile_r, req->img[0].tile_c, sp.fmt[0],
            req->img[0].pow2);
        CUDA_LAUNCH_CHECK(s);
        stats_tile_errors_finish<<<1, ST_THREADS, 0, s->stream>>>(out, tl, ntl);
        CUDA_LAUNCH_CHECK(s);
    }
}
