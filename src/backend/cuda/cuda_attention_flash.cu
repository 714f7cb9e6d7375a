/* CUDA backend — attention core: BF16 tensor-core flash attention (FP8TRAIN_CUDA_ATTN=flash).
 *
 * Inputs come straight from the op's qkv [B, T, 3C] (FP32); head sizes 32, 64 and 128.
 * Numerics (the contract in cuda_common.cuh):
 *   - q, k, v are rounded to BF16 (round-to-nearest-even), RoPE applied first in FP32 when
 *     asked (the prep kernel's arithmetic), by one conversion kernel that writes padded copies
 *     [B*NH, Tp, HS], Tp = T rounded up to 64, rows >= T zero, into scratch slot SCR_ATTN2
 *     (dout likewise from its token-major layout); the tile loads then need no bounds checks.
 *   - dq, dk, dv are written through a row layout (fl_out): straight into dqkv [B, T, 3C]
 *     when there is no RoPE to undo, else per head for the caller's post kernel.
 *   - S = q k^T on tensor cores (mma.sync m16n8k16 BF16 x BF16 -> FP32 accumulate); online
 *     softmax in FP32; P rounded to BF16 for P V; O accumulated in FP32; lse in FP32.
 *     Exponentials are computed base 2 (exp2f of S * scale * log2(e) minus a base-2 max),
 *     which is exp(S * scale - m) up to float rounding.
 *   - backward: P = exp(S * scale - lse) recomputed in FP32 from the BF16 q, k; dP = dout v^T;
 *     dS = P (dP - Dv) in FP32, rounded to BF16 for the products; dv = P^T dout,
 *     dk = dS^T q * scale, dq = dS k * scale, FP32 accumulation and results.
 *   - deterministic, no atomics: one kernel for dk, dv per key tile (looping over query tiles)
 *     and one for dq per query tile (looping over key tiles); both recompute P.
 *   - causal: key tiles above the diagonal are never visited.
 *
 * Tiles: 64 query rows x 64 keys per block step, 128 threads = 4 warps, each warp owns 16 rows
 * of the score tile (16 x 64 = 8 mma n-tiles of 16 x 8). K/V (or Q/dout) tiles stream through
 * shared memory with cp.async double buffering. Shared-memory rows are padded to HS + 8 BF16
 * (a 16-byte multiple) so the fragment loads of a warp hit 32 distinct banks.
 *
 * mma.sync.m16n8k16.row.col (PTX ISA "Matrix fragments for mma.m16n8k16"), per lane with
 * g = lane / 4 (group) and t = lane % 4 (thread in group); each 32-bit register holds two BF16,
 * the lower column index in the low half:
 *   A (16 x 16, row-major): a0 = A[g][2t,2t+1]   a1 = A[g+8][2t,2t+1]
 *                           a2 = A[g][2t+8,+9]   a3 = A[g+8][2t+8,+9]
 *   B (16 x 8, "col": indexed [k][n]): b0 = B[2t,2t+1][g]   b1 = B[2t+8,2t+9][g]
 *   C (16 x 8, FP32): c0, c1 = C[g][2t, 2t+1]   c2, c3 = C[g+8][2t, 2t+1]
 * So C fragments of two adjacent n-tiles (16 columns) are exactly the A fragment of a 16-wide
 * k-step once packed to BF16: that is how P (and dS) feed the second product without shared
 * memory. A B operand stored [n][k] (k contiguous: K for S = Q K^T) is loaded with two 32-bit
 * loads; one stored [k][n] (n contiguous: V for P V) with ldmatrix .trans. */
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"

/* ==== device primitives ==== */

/* c += a * b, one m16n8k16 BF16 tensor-core product with FP32 accumulation (layout above) */
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4],
                                         uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four transposed 8x8 BF16 matrices from shared memory. Lane l gives the address of row l % 8
 * of matrix l / 8; lane 4r + c receives, for each matrix i in r[i], the elements
 * (row 2c, col r) and (row 2c + 1, col r) of that matrix (low half first). */
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const uint16_t *p) {
    unsigned addr = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* 16-byte global -> shared copy that bypasses registers (both addresses 16-byte aligned) */
__device__ __forceinline__ void cp_async16(uint16_t *dst_smem, const uint16_t *src) {
    unsigned addr = (unsigned)__cvta_generic_to_shared(dst_smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* wait until at most N of this thread's committed groups are still in flight */
template <int N>
__device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* two floats -> packed BF16 pair (round-to-nearest-even), lo in the low 16 bits */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* 32-bit load of two adjacent BF16 (4-byte aligned) */
__device__ __forceinline__ uint32_t ld32(const uint16_t *p) {
    return *reinterpret_cast<const uint32_t *>(p);
}

/* ==== kernels ==== */

#define FL_TILE 64     /* query rows and keys per tile */
#define FL_THREADS 128 /* 4 warps x 16 rows */
#define FL_LOG2E 1.4426950408889634f
#define FL_LN2 0.6931471805599453f

/* dst [BH, Tp, D] BF16 from FP32 src: element (bh, t, d) is read at
 * src[(bh / NH) * sB + (bh % NH) * sH + t * sT + d]; rows t >= T are zero. One thread per 8
 * consecutive head dims: two float4 loads (vec, 16-byte aligned source) or 8 scalar loads, one
 * 16-byte store. */
__global__ void flash_to_bf16_kernel(uint16_t *dst, const float *__restrict__ src, int BH,
                                     int T, int Tp, int NH, int D, size_t sB, size_t sH,
                                     size_t sT, int vec) {
    int D8 = D / 8;
    size_t n = (size_t)BH * Tp * D8;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(i % D8);
        size_t row = i / D8; /* bh * Tp + t */
        int t = (int)(row % Tp);
        int bh = (int)(row / Tp);
        float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (t < T) {
            const float *p = src + (size_t)(bh / NH) * sB + (size_t)(bh % NH) * sH +
                             (size_t)t * sT + 8 * c;
            if (vec) {
                float4 u = *reinterpret_cast<const float4 *>(p);
                float4 w = *reinterpret_cast<const float4 *>(p + 4);
                x[0] = u.x, x[1] = u.y, x[2] = u.z, x[3] = u.w;
                x[4] = w.x, x[5] = w.y, x[6] = w.z, x[7] = w.w;
            } else {
                for (int e = 0; e < 8; e++) x[e] = p[e];
            }
        }
        uint4 o;
        o.x = pack_bf16x2(x[0], x[1]);
        o.y = pack_bf16x2(x[2], x[3]);
        o.z = pack_bf16x2(x[4], x[5]);
        o.w = pack_bf16x2(x[6], x[7]);
        *reinterpret_cast<uint4 *>(dst + row * D + 8 * c) = o;
    }
}

/* q, k, v [BH, Tp, HS] BF16 from qkv [B, T, 3C] FP32 (q | k | v, each [NH, HS] per token,
 * C = NH * HS); when cosv is non-NULL q and k are first rotated in FP32 (rotate-half pairs
 * (i, i + HS/2), the arithmetic of attn_prep_kernel); rows t >= T are zero. One thread per
 * (head row, 8 dims i..i+7 of the first half): it also does the partners i + HS/2.., so every
 * load and store is 16 bytes (vec: qkv 16-byte aligned) or scalar loads. */
__global__ void flash_qkv_to_bf16_kernel(uint16_t *qh, uint16_t *kh, uint16_t *vh,
                                         const float *__restrict__ qkv,
                                         const float *__restrict__ cosv,
                                         const float *__restrict__ sinv, int BH, int T, int Tp,
                                         int NH, int HS, int vec) {
    const int half = HS / 2, H8 = half / 8;
    const size_t C = (size_t)NH * HS;
    size_t n = (size_t)BH * Tp * H8;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(i % H8);
        size_t row = i / H8; /* bh * Tp + t */
        int t = (int)(row % Tp);
        int bh = (int)(row / Tp);
        const int d0 = 8 * c, d1 = half + 8 * c;
        float x[6][8]; /* q lo, q hi, k lo, k hi, v lo, v hi */
        for (int a = 0; a < 6; a++)
            for (int e = 0; e < 8; e++) x[a][e] = 0.f;
        if (t < T) {
            const float *src = qkv + ((size_t)(bh / NH) * T + t) * 3 * C + (size_t)(bh % NH) * HS;
            for (int a = 0; a < 6; a++) {
                const float *p = src + (size_t)(a / 2) * C + (a & 1 ? d1 : d0);
                if (vec) {
                    float4 u = *reinterpret_cast<const float4 *>(p);
                    float4 w = *reinterpret_cast<const float4 *>(p + 4);
                    x[a][0] = u.x, x[a][1] = u.y, x[a][2] = u.z, x[a][3] = u.w;
                    x[a][4] = w.x, x[a][5] = w.y, x[a][6] = w.z, x[a][7] = w.w;
                } else {
                    for (int e = 0; e < 8; e++) x[a][e] = p[e];
                }
            }
            if (cosv) {
                for (int e = 0; e < 8; e++) {
                    float cs = cosv[(size_t)t * half + d0 + e], sn = sinv[(size_t)t * half + d0 + e];
                    float q1 = x[0][e], q2 = x[1][e], k1 = x[2][e], k2 = x[3][e];
                    x[0][e] = q1 * cs - q2 * sn;
                    x[1][e] = q2 * cs + q1 * sn;
                    x[2][e] = k1 * cs - k2 * sn;
                    x[3][e] = k2 * cs + k1 * sn;
                }
            }
        }
        uint16_t *dst[3] = {qh, kh, vh};
        for (int a = 0; a < 6; a++) {
            uint4 o;
            o.x = pack_bf16x2(x[a][0], x[a][1]);
            o.y = pack_bf16x2(x[a][2], x[a][3]);
            o.z = pack_bf16x2(x[a][4], x[a][5]);
            o.w = pack_bf16x2(x[a][6], x[a][7]);
            *reinterpret_cast<uint4 *>(dst[a / 2] + row * HS + (a & 1 ? d1 : d0)) = o;
        }
    }
}

/* Where a backward kernel writes head bh's row t of dq, dk or dv (HS contiguous FP32 values):
 * p + (bh / NH) * sB + (bh % NH) * sH + t * sT. Per head [BH, T, HS]: sB = NH*T*HS, sH = T*HS,
 * sT = HS; into dqkv [B, T, 3C]: sB = 3*T*C, sH = HS, sT = 3C (p offset by 0, C, 2C). */
struct fl_out {
    float *p;
    size_t sB, sH, sT;
    int NH;
};

__device__ __forceinline__ float *fl_row(const fl_out &o, int bh, int t) {
    return o.p + (size_t)(bh / o.NH) * o.sB + (size_t)(bh % o.NH) * o.sH + (size_t)t * o.sT;
}

/* Rows [0, 64) of a BF16 [.., D] row-major matrix at g (row stride D) into shared s[64][D + 8]
 * with cp.async; every thread of the block takes part. */
template <int D>
__device__ __forceinline__ void cp_tile(uint16_t *s, const uint16_t *g, int tid) {
    constexpr int LDT = D + 8, CPR = D / 8; /* 16-byte chunks per row */
#pragma unroll
    for (int c = tid; c < FL_TILE * CPR; c += FL_THREADS) {
        int r = c / CPR, cc = c % CPR;
        cp_async16(s + r * LDT + 8 * cc, g + (size_t)r * D + 8 * cc);
    }
}

/* A fragment (16 x 16) of a row-major BF16 matrix in shared memory, s at (row m0, col k0),
 * row pitch ld elements */
__device__ __forceinline__ void lds_a(uint32_t (&a)[4], const uint16_t *s, int ld, int g,
                                      int t) {
    a[0] = ld32(s + g * ld + 2 * t);
    a[1] = ld32(s + (g + 8) * ld + 2 * t);
    a[2] = ld32(s + g * ld + 2 * t + 8);
    a[3] = ld32(s + (g + 8) * ld + 2 * t + 8);
}

/* S[j] (j < 8: keys 8j..8j+7 of the tile) += A(16 x D) * B^T, where A's k-steps come from
 * fragments `a(kk)` and B is a [64][D + 8] shared tile indexed [n = key][k = d]:
 * b0 = B[8j + g][16kk + 2t, +1], b1 = B[8j + g][16kk + 8 + 2t, +1]. */
template <int D>
__device__ __forceinline__ void scores_from_smem_a(float (&s)[8][4], const uint16_t *As,
                                                   const uint16_t *Bs, int g, int t) {
    constexpr int LDT = D + 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a[4];
        lds_a(a, As + 16 * kk, LDT, g, t);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint16_t *bp = Bs + (8 * j + g) * LDT + 16 * kk + 2 * t;
            mma_bf16(s[j], a, ld32(bp), ld32(bp + 8));
        }
    }
}

/* acc[n] (n < D/8: head dims 8n..8n+7) += P(16 x 64) * M(64 x D), P given as C fragments
 * p[j] of 8 n-tiles over the 64 tile rows of M, M a [64][D + 8] shared tile indexed
 * [k = row][n = d]. For k-step kk (rows 16kk..16kk+15) the A fragment is p[2kk], p[2kk+1]
 * packed (see the layout comment at the top); the B fragments of head dims 16n2..16n2+15
 * come from one ldmatrix.x4.trans: lane l addresses row 16kk + (l & 15), col 16n2 + 8 (l >> 4),
 * i.e. matrices (rows +0..7, dims +0..7), (rows +8..15, dims +0..7), (rows +0..7, dims +8..15),
 * (rows +8..15, dims +8..15) = b0, b1 of n-tile 2n2 and b0, b1 of n-tile 2n2 + 1. */
template <int D>
__device__ __forceinline__ void pv_accumulate(float (&acc)[D / 8][4], const float (&p)[8][4],
                                              const uint16_t *Ms, int lane) {
    constexpr int LDT = D + 8;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[4];
        a[0] = pack_bf16x2(p[2 * kk][0], p[2 * kk][1]);         /* row g,   keys 2t, 2t+1 */
        a[1] = pack_bf16x2(p[2 * kk][2], p[2 * kk][3]);         /* row g+8, keys 2t, 2t+1 */
        a[2] = pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]); /* row g,   keys 2t+8, +9 */
        a[3] = pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3]); /* row g+8, keys 2t+8, +9 */
        const uint16_t *mrow = Ms + (16 * kk + (lane & 15)) * LDT + 8 * (lane >> 4);
#pragma unroll
        for (int n2 = 0; n2 < D / 16; n2++) {
            uint32_t b[4];
            ldsm_x4_trans(b, mrow + 16 * n2);
            mma_bf16(acc[2 * n2], a, b[0], b[1]);
            mma_bf16(acc[2 * n2 + 1], a, b[2], b[3]);
        }
    }
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* Forward. Grid (BH, nT), block 128. Query tile qt = nT - 1 - blockIdx.y (the longest rows are
 * scheduled first). q, k, v: BF16 [BH, Tp, D]. Warp w owns query rows qt*64 + 16w + [0, 16);
 * lane (g, t) holds rows r0 = .. + g and r1 = r0 + 8 of every score fragment. Online softmax
 * in base 2: s2 = S * scale * log2(e), running max m (base 2), running per-thread partial row
 * sums l (reduced over the quad at the end; the rescale factors are quad-uniform). */
template <int D>
__global__ void __launch_bounds__(FL_THREADS)
    flash_fwd_kernel(float *out, float *lse, const uint16_t *__restrict__ q,
                     const uint16_t *__restrict__ k, const uint16_t *__restrict__ v, int T,
                     int Tp, int NH, float scale_log2) {
    constexpr int LDT = D + 8, TILE = FL_TILE * LDT;
    extern __shared__ uint4 flash_smem[];
    uint16_t *Ks = reinterpret_cast<uint16_t *>(flash_smem); /* [2][64][LDT] */
    uint16_t *Vs = Ks + 2 * TILE;                              /* [2][64][LDT] */
    int nT = Tp / FL_TILE;
    int bh = blockIdx.x, qt = nT - 1 - (int)blockIdx.y;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const uint16_t *qb = q + (size_t)bh * Tp * D, *kb = k + (size_t)bh * Tp * D,
                   *vb = v + (size_t)bh * Tp * D;

    cp_tile<D>(Ks, kb, tid);
    cp_tile<D>(Vs, vb, tid);
    cp_async_commit();

    /* this warp's Q rows as A fragments, straight from global (read once) */
    uint32_t qf[D / 16][4];
    {
        const uint16_t *qw = qb + (size_t)(qt * FL_TILE + 16 * warp) * D;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            qf[kk][0] = ld32(qw + g * D + 16 * kk + 2 * t);
            qf[kk][1] = ld32(qw + (g + 8) * D + 16 * kk + 2 * t);
            qf[kk][2] = ld32(qw + g * D + 16 * kk + 2 * t + 8);
            qf[kk][3] = ld32(qw + (g + 8) * D + 16 * kk + 2 * t + 8);
        }
    }
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    int lrow0 = 16 * warp + g, lrow1 = lrow0 + 8; /* rows within the tile */

    for (int kt = 0; kt <= qt; kt++) {
        int st = kt & 1;
        if (kt < qt) { /* prefetch the next K, V tile into the other stage */
            cp_tile<D>(Ks + (st ^ 1) * TILE, kb + (size_t)(kt + 1) * FL_TILE * D, tid);
            cp_tile<D>(Vs + (st ^ 1) * TILE, vb + (size_t)(kt + 1) * FL_TILE * D, tid);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint16_t *Kc = Ks + st * TILE, *Vc = Vs + st * TILE;

        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint16_t *bp = Kc + (8 * j + g) * LDT + 16 * kk + 2 * t;
                mma_bf16(s[j], qf[kk], ld32(bp), ld32(bp + 8));
            }

        /* scale to base 2; on the diagonal tile mask keys after the query (this also masks
         * keys >= T for every row < T; the explicit test keeps the padded rows finite too) */
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] *= scale_log2;
        if (kt == qt) {
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = 8 * j + 2 * t + (e & 1);
                    int row = (e < 2) ? lrow0 : lrow1;
                    if (key > row || kt * FL_TILE + key >= T) s[j][e] = -INFINITY;
                }
        }

        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
            mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
        }
        mx0 = quad_max(mx0);
        mx1 = quad_max(mx1);
        /* a row with nothing unmasked yet keeps m = -inf; subtract 0 then so that
         * exp2(-inf - -inf) never makes a NaN (its p are all 0) */
        float mu0 = mx0 == -INFINITY ? 0.f : mx0, mu1 = mx1 == -INFINITY ? 0.f : mx1;
        float alpha0 = exp2f(m0 - mu0), alpha1 = exp2f(m1 - mu1);
        m0 = mx0, m1 = mx1;
        float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            s[j][0] = exp2f(s[j][0] - mu0);
            s[j][1] = exp2f(s[j][1] - mu0);
            s[j][2] = exp2f(s[j][2] - mu1);
            s[j][3] = exp2f(s[j][3] - mu1);
            rs0 += s[j][0] + s[j][1];
            rs1 += s[j][2] + s[j][3];
        }
        l0 = l0 * alpha0 + rs0;
        l1 = l1 * alpha1 + rs1;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o[n][0] *= alpha0, o[n][1] *= alpha0;
            o[n][2] *= alpha1, o[n][3] *= alpha1;
        }
        pv_accumulate<D>(o, s, Vc, lane);
        __syncthreads(); /* the stage is overwritten by the prefetch of iteration kt + 1 */
    }

    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    int b = bh / NH, h = bh % NH;
    int row0 = qt * FL_TILE + lrow0, row1 = row0 + 8;
    size_t C = (size_t)NH * D;
    if (row0 < T) {
        float inv = 1.f / l0;
        float *orow = out + ((size_t)b * T + row0) * C + (size_t)h * D + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<float2 *>(orow + 8 * n) = make_float2(o[n][0] * inv, o[n][1] * inv);
        if (t == 0) lse[(size_t)bh * T + row0] = (m0 + log2f(l0)) * FL_LN2;
    }
    if (row1 < T) {
        float inv = 1.f / l1;
        float *orow = out + ((size_t)b * T + row1) * C + (size_t)h * D + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<float2 *>(orow + 8 * n) = make_float2(o[n][2] * inv, o[n][3] * inv);
        if (t == 0) lse[(size_t)bh * T + row1] = (m1 + log2f(l1)) * FL_LN2;
    }
}

/* dq per query tile. Grid (BH, nT), qt = nT - 1 - blockIdx.y; loops over key tiles kt <= qt.
 * Shared: Q, dO [64][LDT] (loaded once), K, V [2][64][LDT]. Per key tile: S = Q K^T and
 * dP = dO V^T (warp: 16 rows x 64 keys), P = exp2(S * scale * log2e - lse * log2e),
 * dS = P (dP - Dv), dq += dS K (K as [k = key][n = d], ldmatrix.trans). */
template <int D>
__global__ void __launch_bounds__(FL_THREADS)
    flash_bwd_dq_kernel(fl_out dq, const uint16_t *__restrict__ q,
                        const uint16_t *__restrict__ k, const uint16_t *__restrict__ v,
                        const uint16_t *__restrict__ dout, const float *__restrict__ lse,
                        const float *__restrict__ Dv, int T, int Tp, float scale,
                        float scale_log2) {
    constexpr int LDT = D + 8, TILE = FL_TILE * LDT;
    extern __shared__ uint4 flash_smem[];
    uint16_t *Qs = reinterpret_cast<uint16_t *>(flash_smem); /* [64][LDT] */
    uint16_t *dOs = Qs + TILE;                                /* [64][LDT] */
    uint16_t *Ks = dOs + TILE;                                /* [2][64][LDT] */
    uint16_t *Vs = Ks + 2 * TILE;                             /* [2][64][LDT] */
    int nT = Tp / FL_TILE;
    int bh = blockIdx.x, qt = nT - 1 - (int)blockIdx.y;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    size_t base = (size_t)bh * Tp * D;
    const uint16_t *kb = k + base, *vb = v + base;

    cp_tile<D>(Qs, q + base + (size_t)qt * FL_TILE * D, tid);
    cp_tile<D>(dOs, dout + base + (size_t)qt * FL_TILE * D, tid);
    cp_tile<D>(Ks, kb, tid);
    cp_tile<D>(Vs, vb, tid);
    cp_async_commit();

    int lrow0 = 16 * warp + g, lrow1 = lrow0 + 8;
    int row0 = qt * FL_TILE + lrow0, row1 = row0 + 8;
    float L0 = row0 < T ? lse[(size_t)bh * T + row0] * FL_LOG2E : 0.f;
    float L1 = row1 < T ? lse[(size_t)bh * T + row1] * FL_LOG2E : 0.f;
    float D0 = row0 < T ? Dv[(size_t)bh * T + row0] : 0.f;
    float D1 = row1 < T ? Dv[(size_t)bh * T + row1] : 0.f;
    float acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    const uint16_t *Qw = Qs + 16 * warp * LDT, *dOw = dOs + 16 * warp * LDT;

    for (int kt = 0; kt <= qt; kt++) {
        int st = kt & 1;
        if (kt < qt) {
            cp_tile<D>(Ks + (st ^ 1) * TILE, kb + (size_t)(kt + 1) * FL_TILE * D, tid);
            cp_tile<D>(Vs + (st ^ 1) * TILE, vb + (size_t)(kt + 1) * FL_TILE * D, tid);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint16_t *Kc = Ks + st * TILE, *Vc = Vs + st * TILE;

        float s[8][4], dp[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
            dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.f;
        }
        scores_from_smem_a<D>(s, Qw, Kc, g, t);
        scores_from_smem_a<D>(dp, dOw, Vc, g, t);
        bool diag = kt == qt;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = 8 * j + 2 * t + (e & 1);
                int lrow = (e < 2) ? lrow0 : lrow1;
                float L = (e < 2) ? L0 : L1, Dr = (e < 2) ? D0 : D1;
                float p = exp2f(s[j][e] * scale_log2 - L);
                if (diag && (key > lrow || kt * FL_TILE + key >= T)) p = 0.f;
                s[j][e] = p * (dp[j][e] - Dr); /* dS */
            }
        pv_accumulate<D>(acc, s, Kc, lane);
        __syncthreads();
    }

    if (row0 < T) {
        float *o = fl_row(dq, bh, row0) + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<float2 *>(o + 8 * n) =
                make_float2(acc[n][0] * scale, acc[n][1] * scale);
    }
    if (row1 < T) {
        float *o = fl_row(dq, bh, row1) + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<float2 *>(o + 8 * n) =
                make_float2(acc[n][2] * scale, acc[n][3] * scale);
    }
}

/* dk, dv per key tile. Grid (BH, nT), kt = blockIdx.y (the most query tiles first); loops over
 * query tiles qt >= kt. Transposed scores: warp w owns keys kt*64 + 16w + [0, 16) as rows and
 * the 64 queries of the tile as columns: S^T = K Q^T, dP^T = V dO^T, P^T = exp2(S^T * scale *
 * log2e - lse[query] * log2e), dS^T = P^T (dP^T - Dv[query]); dv += P^T dO, dk += dS^T Q
 * (dO, Q as [k = query][n = d], ldmatrix.trans). Shared: K, V [64][LDT] (loaded once),
 * Q, dO [2][64][LDT], lse * log2e and Dv of the query tile [2][64] FP32. */
template <int D>
__global__ void __launch_bounds__(FL_THREADS)
    flash_bwd_dkdv_kernel(fl_out dk, fl_out dv, const uint16_t *__restrict__ q,
                          const uint16_t *__restrict__ k, const uint16_t *__restrict__ v,
                          const uint16_t *__restrict__ dout, const float *__restrict__ lse,
                          const float *__restrict__ Dv, int T, int Tp, float scale,
                          float scale_log2) {
    constexpr int LDT = D + 8, TILE = FL_TILE * LDT;
    extern __shared__ uint4 flash_smem[];
    uint16_t *Ks = reinterpret_cast<uint16_t *>(flash_smem); /* [64][LDT] */
    uint16_t *Vs = Ks + TILE;                                 /* [64][LDT] */
    uint16_t *Qs = Vs + TILE;                                 /* [2][64][LDT] */
    uint16_t *dOs = Qs + 2 * TILE;                            /* [2][64][LDT] */
    float *Ls = reinterpret_cast<float *>(dOs + 2 * TILE);    /* [2][64] lse * log2e */
    float *Ds = Ls + 2 * FL_TILE;                             /* [2][64] Dv */
    int nT = Tp / FL_TILE;
    int bh = blockIdx.x, kt = (int)blockIdx.y;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    size_t base = (size_t)bh * Tp * D;
    const uint16_t *qb = q + base, *dob = dout + base;
    const float *lseb = lse + (size_t)bh * T, *Dvb = Dv + (size_t)bh * T;

    cp_tile<D>(Ks, k + base + (size_t)kt * FL_TILE * D, tid);
    cp_tile<D>(Vs, v + base + (size_t)kt * FL_TILE * D, tid);
    cp_tile<D>(Qs, qb + (size_t)kt * FL_TILE * D, tid);
    cp_tile<D>(dOs, dob + (size_t)kt * FL_TILE * D, tid);
    cp_async_commit();
    if (tid < FL_TILE) {
        int row = kt * FL_TILE + tid;
        Ls[tid] = row < T ? lseb[row] * FL_LOG2E : 0.f;
        Ds[tid] = row < T ? Dvb[row] : 0.f;
    }

    int lkey0 = 16 * warp + g, lkey1 = lkey0 + 8; /* keys within the tile */
    float adk[D / 8][4], adv[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        adk[n][0] = adk[n][1] = adk[n][2] = adk[n][3] = 0.f;
        adv[n][0] = adv[n][1] = adv[n][2] = adv[n][3] = 0.f;
    }
    const uint16_t *Kw = Ks + 16 * warp * LDT, *Vw = Vs + 16 * warp * LDT;

    for (int qt = kt; qt < nT; qt++) {
        int st = (qt - kt) & 1;
        if (qt + 1 < nT) {
            int nx = st ^ 1;
            cp_tile<D>(Qs + nx * TILE, qb + (size_t)(qt + 1) * FL_TILE * D, tid);
            cp_tile<D>(dOs + nx * TILE, dob + (size_t)(qt + 1) * FL_TILE * D, tid);
            cp_async_commit();
            if (tid < FL_TILE) {
                int row = (qt + 1) * FL_TILE + tid;
                Ls[nx * FL_TILE + tid] = row < T ? lseb[row] * FL_LOG2E : 0.f;
                Ds[nx * FL_TILE + tid] = row < T ? Dvb[row] : 0.f;
            }
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint16_t *Qc = Qs + st * TILE, *dOc = dOs + st * TILE;
        const float *Lc = Ls + st * FL_TILE, *Dc = Ds + st * FL_TILE;

        float s[8][4], dp[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
            dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.f;
        }
        scores_from_smem_a<D>(s, Kw, Qc, g, t);  /* S^T: rows keys, cols queries */
        scores_from_smem_a<D>(dp, Vw, dOc, g, t); /* dP^T */
        /* masks: query before key (diagonal tile) and queries >= T (last tile) */
        bool need_mask = qt == kt || qt == nT - 1;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int lq = 8 * j + 2 * t + (e & 1); /* query within the tile */
                int lkey = (e < 2) ? lkey0 : lkey1;
                float p = exp2f(s[j][e] * scale_log2 - Lc[lq]);
                if (need_mask &&
                    (qt * FL_TILE + lq < kt * FL_TILE + lkey || qt * FL_TILE + lq >= T))
                    p = 0.f;
                s[j][e] = p;                         /* P^T */
                dp[j][e] = p * (dp[j][e] - Dc[lq]); /* dS^T */
            }
        pv_accumulate<D>(adv, s, dOc, lane);
        pv_accumulate<D>(adk, dp, Qc, lane);
        __syncthreads();
    }

    int key0 = kt * FL_TILE + lkey0, key1 = key0 + 8;
    if (key0 < T) {
        float *ok = fl_row(dk, bh, key0) + 2 * t;
        float *ov = fl_row(dv, bh, key0) + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            *reinterpret_cast<float2 *>(ok + 8 * n) =
                make_float2(adk[n][0] * scale, adk[n][1] * scale);
            *reinterpret_cast<float2 *>(ov + 8 * n) = make_float2(adv[n][0], adv[n][1]);
        }
    }
    if (key1 < T) {
        float *ok = fl_row(dk, bh, key1) + 2 * t;
        float *ov = fl_row(dv, bh, key1) + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            *reinterpret_cast<float2 *>(ok + 8 * n) =
                make_float2(adk[n][2] * scale, adk[n][3] * scale);
            *reinterpret_cast<float2 *>(ov + 8 * n) = make_float2(adv[n][2], adv[n][3]);
        }
    }
}

/* ==== host side ==== */

/* shared-memory bytes of each kernel (BF16 tiles of 64 rows, pitch D + 8) */
static size_t fwd_smem(int D) { return (size_t)4 * FL_TILE * (D + 8) * 2; }
static size_t dq_smem(int D) { return (size_t)6 * FL_TILE * (D + 8) * 2; }
static size_t dkdv_smem(int D) {
    return (size_t)6 * FL_TILE * (D + 8) * 2 + (size_t)4 * FL_TILE * sizeof(float);
}

/* Raise the dynamic shared-memory limit of the kernels for head size D, once. */
template <int D>
static void flash_setup(void) {
    static int done = 0;
    if (done) return;
    CUDA_CHECK(cudaFuncSetAttribute(flash_fwd_kernel<D>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fwd_smem(D)));
    CUDA_CHECK(cudaFuncSetAttribute(flash_bwd_dq_kernel<D>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dq_smem(D)));
    CUDA_CHECK(cudaFuncSetAttribute(flash_bwd_dkdv_kernel<D>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dkdv_smem(D)));
    done = 1;
}

int cuda_attn_flash_supported(int B, int T, int NH, int HS) {
    if (HS != 32 && HS != 64 && HS != 128) return 0;
    if (B <= 0 || T <= 0 || NH <= 0) return 0;
    if ((T + FL_TILE - 1) / FL_TILE > 65535) return 0; /* grid.y */
    if ((long long)B * NH > 2147483647LL) return 0;    /* grid.x */
    return 1;
}

/* BF16 copy [BH, Tp, HS] of the token-major FP32 dout [B, T, NH*HS], rows >= T zero. */
static void dout_to_bf16(cuda_state *s, uint16_t *dst, const float *src, int B, int T, int Tp,
                         int NH, int HS) {
    size_t sB = (size_t)T * NH * HS, sH = HS, sT = (size_t)NH * HS;
    int vec = ((uintptr_t)src & 15) == 0; /* row offsets are multiples of HS (8 floats) */
    size_t n = (size_t)B * NH * Tp * (HS / 8);
    size_t want = (n + 255) / 256, cap = (size_t)s->num_sms * 32;
    unsigned blocks = (unsigned)(want < cap ? want : cap);
    flash_to_bf16_kernel<<<blocks, 256, 0, s->stream>>>(dst, src, B * NH, T, Tp, NH, HS, sB, sH,
                                                        sT, vec);
    CUDA_LAUNCH_CHECK(s);
}

/* q, k, v as padded BF16 [BH, Tp, HS] from qkv (RoPE applied when cosv is non-NULL). */
static void qkv_to_bf16(cuda_state *s, uint16_t *qh, uint16_t *kh, uint16_t *vh,
                        const float *qkv, const float *cosv, const float *sinv, int B, int T,
                        int Tp, int NH, int HS) {
    int vec = ((uintptr_t)qkv & 15) == 0; /* C = NH * HS is a multiple of 32 */
    size_t n = (size_t)B * NH * Tp * (HS / 16);
    size_t want = (n + 255) / 256, cap = (size_t)s->num_sms * 32;
    unsigned blocks = (unsigned)(want < cap ? want : cap);
    flash_qkv_to_bf16_kernel<<<blocks, 256, 0, s->stream>>>(qh, kh, vh, qkv, cosv, sinv, B * NH,
                                                            T, Tp, NH, HS, vec);
    CUDA_LAUNCH_CHECK(s);
}

template <int D>
static void fwd_launch(cuda_state *s, dim3 grid, float *out, float *lse, const uint16_t *qh,
                       const uint16_t *kh, const uint16_t *vh, int T, int Tp, int NH,
                       float scale_log2) {
    flash_setup<D>();
    flash_fwd_kernel<D><<<grid, FL_THREADS, fwd_smem(D), s->stream>>>(out, lse, qh, kh, vh, T,
                                                                     Tp, NH, scale_log2);
    CUDA_LAUNCH_CHECK(s);
}

template <int D>
static void bwd_launch(cuda_state *s, dim3 grid, fl_out dq, fl_out dk, fl_out dv,
                       const uint16_t *qh, const uint16_t *kh, const uint16_t *vh,
                       const uint16_t *doh, const float *lse, const float *Dv, int T, int Tp,
                       float scale, float scale_log2) {
    flash_setup<D>();
    flash_bwd_dkdv_kernel<D><<<grid, FL_THREADS, dkdv_smem(D), s->stream>>>(
        dk, dv, qh, kh, vh, doh, lse, Dv, T, Tp, scale, scale_log2);
    CUDA_LAUNCH_CHECK(s);
    flash_bwd_dq_kernel<D><<<grid, FL_THREADS, dq_smem(D), s->stream>>>(
        dq, qh, kh, vh, doh, lse, Dv, T, Tp, scale, scale_log2);
    CUDA_LAUNCH_CHECK(s);
}

int cuda_attn_flash_fwd(fp8t_backend *b, float *out, float *lse, const float *qkv,
                        const float *cosv, const float *sinv, int B, int T, int NH, int HS,
                        float scale) {
    if (!cuda_attn_flash_supported(B, T, NH, HS)) return -1;
    cuda_state *s = cuda_of(b);
    int nT = (T + FL_TILE - 1) / FL_TILE, Tp = nT * FL_TILE, BH = B * NH;
    size_t per = (size_t)BH * Tp * HS; /* BF16 elements of one padded copy */
    uint16_t *qh = (uint16_t *)cuda_scratch(b, SCR_ATTN2, 3 * per * sizeof(uint16_t));
    uint16_t *kh = qh + per, *vh = kh + per;
    qkv_to_bf16(s, qh, kh, vh, qkv, cosv, sinv, B, T, Tp, NH, HS);
    float scale_log2 = scale * FL_LOG2E;
    dim3 grid(BH, nT);
    if (HS == 32) fwd_launch<32>(s, grid, out, lse, qh, kh, vh, T, Tp, NH, scale_log2);
    else if (HS == 64) fwd_launch<64>(s, grid, out, lse, qh, kh, vh, T, Tp, NH, scale_log2);
    else fwd_launch<128>(s, grid, out, lse, qh, kh, vh, T, Tp, NH, scale_log2);
    return 0;
}

int cuda_attn_flash_bwd(fp8t_backend *b, float *dqkv, float *dq, float *dk, float *dv,
                        const float *qkv, const float *cosv, const float *sinv,
                        const float *dout, const float *lse, const float *Dv, int B, int T,
                        int NH, int HS, float scale) {
    if (!cuda_attn_flash_supported(B, T, NH, HS)) return -1;
    cuda_state *s = cuda_of(b);
    int nT = (T + FL_TILE - 1) / FL_TILE, Tp = nT * FL_TILE, BH = B * NH;
    size_t per = (size_t)BH * Tp * HS;
    uint16_t *qh = (uint16_t *)cuda_scratch(b, SCR_ATTN2, 4 * per * sizeof(uint16_t));
    uint16_t *kh = qh + per, *vh = kh + per, *doh = vh + per;
    qkv_to_bf16(s, qh, kh, vh, qkv, cosv, sinv, B, T, Tp, NH, HS);
    dout_to_bf16(s, doh, dout, B, T, Tp, NH, HS);
    const size_t C = (size_t)NH * HS;
    fl_out oq, ok, ov;
    if (dqkv) { /* token-major, straight into the op's result */
        oq = {dqkv, 3 * (size_t)T * C, (size_t)HS, 3 * C, NH};
        ok = oq, ov = oq;
        ok.p = dqkv + C, ov.p = dqkv + 2 * C;
    } else { /* per head [BH, T, HS] */
        oq = {dq, (size_t)NH * T * HS, (size_t)T * HS, (size_t)HS, NH};
        ok = oq, ov = oq;
        ok.p = dk, ov.p = dv;
    }
    float scale_log2 = scale * FL_LOG2E;
    dim3 grid(BH, nT);
    if (HS == 32)
        bwd_launch<32>(s, grid, oq, ok, ov, qh, kh, vh, doh, lse, Dv, T, Tp, scale, scale_log2);
    else if (HS == 64)
        bwd_launch<64>(s, grid, oq, ok, ov, qh, kh, vh, doh, lse, Dv, T, Tp, scale, scale_log2);
    else
        bwd_launch<128>(s, grid, oq, ok, ov, qh, kh, vh, doh, lse, Dv, T, Tp, scale, scale_log2);
    return 0;
}
