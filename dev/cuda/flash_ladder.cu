/* dev/cuda/flash_ladder.cu — the BF16 tensor-core flash attention of
 * src/backend/cuda/cuda_attention_flash.cu (causal, forward + deterministic two-kernel
 * backward), kernel by kernel, llm.c style: every version is checked against version 1 and
 * against a CPU double-precision reference, then all are timed side by side on the GPT-2 shapes.
 *
 * Build and run from the repository root (needs only the CUDA runtime, linked statically):
 *
 *   mkdir -p build-flash/dev && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -Xcompiler -Wall,-Wextra -o build-flash/dev/flash_ladder dev/cuda/flash_ladder.cu && build-flash/dev/flash_ladder
 *
 * (`make BUILD=build-flash all` builds it as build-flash/dev/cuda/flash_ladder.) Optional
 * arguments: `flash_ladder [iters] [check] [-v]` — timed launches per kernel (default 10);
 * `check` runs the checks only; `-v` prints every passing check too (by default a failing check
 * prints its own line and each version and shape gets one summary line with its errors).
 *
 * Every version has the shipped interface, so the lead can port one by a copy: inputs q, k, v,
 * dout BF16 padded [BH, Tp, HS] (Tp = T rounded up to 64, rows >= T zero), out FP32 [B, T, C],
 * lse FP32 [BH, T], Dv = rowsum(dout * out) FP32 [BH, T], dq / dk / dv written through fl_out
 * row layouts (per head [BH, T, HS] or token-major into dqkv [B, T, 3C]). Head sizes 32/64/128.
 *
 * Versions:
 *   1  the previously shipped kernels (src/backend/cuda/cuda_attention_flash.cu as of commit
 *      2667dd2), copied below verbatim inside `namespace v1`: 64 query rows x 64 keys, 4 warps
 *      x 16 rows, K (and Q, dO, V for the scores) fragments with two 32-bit shared loads per mma,
 *      ldmatrix.trans for the P V-style products, cp.async double buffering; the backward as a
 *      dk/dv kernel per key tile and a dq kernel per query tile, both recomputing P.
 *   2  `namespace v2`, the same arithmetic in the same order per row (results BIT-IDENTICAL to
 *      version 1, which the checks require), faster:
 *      - every fragment through ldmatrix (.x4 non-transposed for A operands and for B operands
 *        stored [n][k]; .x4.trans as before for [k][n]): 4x fewer shared-load instructions;
 *      - two m16 tiles per warp for head sizes 32/64 (32 query rows, or 32 keys in dk/dv, per
 *        warp; 128-row blocks): every B fragment loaded from shared memory feeds two mma, so
 *        shared-memory bytes per mma halve. Key tiles stay 64 wide (the forward's online softmax
 *        sees the same 64-key blocks, so per-row numerics do not change); a warp whose rows end
 *        before a key tile skips it (warp-uniform), and the diagonal tile of each warp is the
 *        only one masked (two instantiations of the tile body, no per-element mask elsewhere);
 *      - backward tiles processed in 32-wide steps (query steps in dk/dv, key steps in dq when
 *        two m16 tiles are held), which keeps the FP32 scores of a step in registers without
 *        spills; a step whose entries are all masked is skipped (it would add exact zeros);
 *      - Q (and dO) fragments kept in registers for head sizes <= 64 (read once per block);
 *      - dk/dv: the next query tile's lse and Dv loaded into registers during the current tile
 *        and stored to shared memory at its end (version 1 stalled on those global loads).
 *      Head size 128 keeps one m16 tile per warp (two would need > 255 registers) and gets the
 *      rest.
 *   3  version 2's kernels with FAST = true (a template argument): exponentials as one
 *      ex2.approx.ftz instruction (exp2f is MUFU.EX2 plus a compare and two predicated
 *      multiplies that keep subnormal results; here p < 2^-126 flushes to 0, which P rounded
 *      to BF16 for the products and the sums never see), and the forward folds the scale into
 *      the exponent: p = 2^(S * scale * log2e - m) as one FFMA on the raw score, the row max
 *      taken on raw scores and scaled once (the same value: rounding is monotonic). Not
 *      bit-identical to version 1 (exponent arguments differ by one FP32 rounding).
 *   4  version 3 with one m16 tile per warp for every head size (template argument MT = 1):
 *      16 rows (or keys) per warp and 64-row blocks as in version 1, so fewer registers and
 *      more blocks per SM (12 warps instead of 8 at head size 64), but each B fragment feeds
 *      one mma. Versions 3 and 4 are the same kernels at head size 128. Comparing 3 with 4 says
 *      whether shared-memory traffic or occupancy limits the head size 64 kernels.
 *   5  version 3 with a head-major grid (template argument HM): grid (row blocks, BH) instead
 *      of (BH, row blocks), so consecutive blocks are the tiles of one head (longest first) and
 *      the blocks resident at once read the same heads' K, V (forward, dq) or Q, dO (dk/dv),
 *      which L2 then serves; in version 1's order the ~260 resident blocks stream as many
 *      different heads (T = 1024, HS = 64: 256 KB of K, V per head, 67 MB > L2), and each
 *      head's K, V come from DRAM once per query tile. Numerics as version 3. Needs BH <= 65535
 *      (grid.y).
 *   6  version 4 with version 5's head-major grid (the two changes together, in case both win).
 *
 * Shipped now (src/backend/cuda/cuda_attention_flash.cu): version 3's kernels (v2 with FAST =
 * true, the default MT, HM = false; grids and shared-memory sizes as here) for the forward, dq
 * and dk/dv at head sizes 32 and 64, and for dq and dk/dv at head size 128; the head-size-128
 * forward stays version 1's (flash_fwd_v1_kernel there), faster at that size. The shipped
 * kernels compile to the same PTX as the ladder's (up to names). This file stays standalone:
 * it does not include the shipped file, so versions 1 and 2 remain its own copies. Measured on
 * an H200 (all 1008 checks of that run passed), ms per layer call, forward / backward:
 *   GPT-2 124M (B=32, NH=12, T=1024, HS=64): v1 0.270 / 0.808, v3 0.215 / 0.638
 *   GPT-2 1.5B (B=16, NH=25, T=1024, HS=64): v1 0.282 / 0.841, v3 0.222 / 0.665
 *   B=8, NH=16, T=2048, HS=128:              v1 0.638 / 1.936, v3 0.684 / 1.871
 *
 * ptxas (CUDA 13.0, sm_90a): registers, dynamic shared KB, blocks per SM (65536 registers,
 * 228 KB per SM); no spills in any timed kernel.
 *            HS 64: fwd     dk/dv        dq           HS 128: fwd   dk/dv        dq
 *   v1      126 37 4     168 56 3     166 55 3        170 70 2      254 105 2    166 104 2
 *   v2      254 55 2     251 75 2     254 74 2        145 87 2      242 105 2    166 104 2
 *   v3, v5  253 55 2     255 75 2     243 74 2        137 87 2      237 105 2    166 104 2
 *   v4, v6  135 46 3     161 56 3     136 55 3        (v3's kernels)
 *
 * Checks (all of a version's must pass before it is timed; the exit status is non-zero if any
 * fails): on B=2, NH=3 and T = 1, 63, 64, 65, 150, 200, 257 for each head size 32, 64, 128
 * (one head with 4x larger q for peaked softmax rows), each version's out, lse, dq, dk, dv
 *   - against a CPU double-precision causal attention on the same BF16 inputs: max |x - ref|
 *     over the tensor / max |ref| <= 1e-2 for out and 2e-2 for dq, dk, dv (P and dS are rounded
 *     to BF16 for the products, 2^-9 relative each), |lse - ref| <= 1e-4; NaN never passes;
 *   - against version 1: bit for bit for version 2 (every output byte, the guard floats after
 *     out, lse and dq|dk|dv included); within 2e-3 (out), 5e-3 (dq|dk|dv, of the max) and 1e-4
 *     absolute (lse) for versions 3 to 6, whose exponentials differ in the last bits;
 *   - guard floats after out, lse and dq|dk|dv never written (all buffers start as NaN, so a
 *     value left unwritten fails the CPU comparison);
 * and on the three timing shapes the same against version 1 plus the CPU reference on the last
 * head (B * NH - 1).
 *
 * Timing: CUDA events around `iters` back-to-back launches of each kernel, inputs larger than
 * L2, on GPT-2 124M (B=32, NH=12, T=1024, HS=64), GPT-2 1.5B (B=16, NH=25, T=1024, HS=64) and
 * B=8, NH=16, T=2048, HS=128. TFLOP/s counts causal useful FLOPs: forward 4*B*NH*T*T*HS/2 (two
 * products), backward 2.5x that (five products); per backward kernel the products it executes
 * (dk/dv: S, dP, dV, dK = 4; dq: S, dP, dQ = 3), so the two kernels' figures exceed the total.
 * One row per version and shape: ms and TFLOP/s of forward, dk/dv, dq, backward total, and the
 * forward and backward speedups over version 1.
 *
 * Status when versions 2 to 6 were written: compiled only (no GPU at hand; the H200 figures
 * above came later), and every kernel run in a lane-level host emulation of mma.sync /
 * ldmatrix / cp.async / shuffles driven by this file's own checks (all pass: version 2 equal to
 * version 1 bit for bit, every version within tolerance of the CPU reference). The emulation
 * cannot see ptxas's FFMA contraction: if on the GPU only version 2's "bits vs v1" checks fail
 * while its CPU errors equal version 1's, the compiler fused a multiply-add differently, not a
 * bug in the arithmetic order. */
#include "backend/cuda/cuda_common.cuh"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <vector>

/* ==== version 1: src/backend/cuda/cuda_attention_flash.cu as of commit 2667dd2, from its
 * device primitives to its shared-memory setup, verbatim (only wrapped in a namespace) ==== */
namespace v1 {
/* ==== device primitives ==== */

/* c += a * b, one m16n8k16 BF16 tensor-core product with FP32 accumulation (layout above) */
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
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
template <int N> __device__ __forceinline__ void cp_async_wait(void) {
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
__global__ void flash_to_bf16_kernel(uint16_t *dst, const float *__restrict__ src, int BH, int T,
                                     int Tp, int NH, int D, size_t sB, size_t sH, size_t sT,
                                     int vec) {
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
            const float *p =
                src + (size_t)(bh / NH) * sB + (size_t)(bh % NH) * sH + (size_t)t * sT + 8 * c;
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
                    float cs = cosv[(size_t)t * half + d0 + e],
                          sn = sinv[(size_t)t * half + d0 + e];
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
__device__ __forceinline__ void lds_a(uint32_t (&a)[4], const uint16_t *s, int ld, int g, int t) {
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
    uint16_t *Vs = Ks + 2 * TILE;                            /* [2][64][LDT] */
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
    flash_bwd_dq_kernel(fl_out dq, const uint16_t *__restrict__ q, const uint16_t *__restrict__ k,
                        const uint16_t *__restrict__ v, const uint16_t *__restrict__ dout,
                        const float *__restrict__ lse, const float *__restrict__ Dv, int T,
                        int Tp, float scale, float scale_log2) {
    constexpr int LDT = D + 8, TILE = FL_TILE * LDT;
    extern __shared__ uint4 flash_smem[];
    uint16_t *Qs = reinterpret_cast<uint16_t *>(flash_smem); /* [64][LDT] */
    uint16_t *dOs = Qs + TILE;                               /* [64][LDT] */
    uint16_t *Ks = dOs + TILE;                               /* [2][64][LDT] */
    uint16_t *Vs = Ks + 2 * TILE;                            /* [2][64][LDT] */
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
    uint16_t *Vs = Ks + TILE;                                /* [64][LDT] */
    uint16_t *Qs = Vs + TILE;                                /* [2][64][LDT] */
    uint16_t *dOs = Qs + 2 * TILE;                           /* [2][64][LDT] */
    float *Ls = reinterpret_cast<float *>(dOs + 2 * TILE);   /* [2][64] lse * log2e */
    float *Ds = Ls + 2 * FL_TILE;                            /* [2][64] Dv */
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
        scores_from_smem_a<D>(s, Kw, Qc, g, t);   /* S^T: rows keys, cols queries */
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
                s[j][e] = p;                        /* P^T */
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
template <int D> static void flash_setup(void) {
    static int done = 0;
    if (done) return;
    CUDA_CHECK(cudaFuncSetAttribute(
        flash_fwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fwd_smem(D)));
    CUDA_CHECK(cudaFuncSetAttribute(
        flash_bwd_dq_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dq_smem(D)));
    CUDA_CHECK(cudaFuncSetAttribute(flash_bwd_dkdv_kernel<D>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dkdv_smem(D)));
    done = 1;
}

} /* namespace v1 */

/* ==== version 2 (see the header): ldmatrix everywhere, two m16 tiles per warp for head sizes
 * <= 64, masks on the diagonal tile only, 32-wide backward steps. Same arithmetic per row as
 * version 1, so bit-identical results. ==== */
namespace v2 {

/* ---- v2 device primitives (PTX) ---- */

/* c += a * b, one m16n8k16 BF16 tensor-core product with FP32 accumulation (fragment layout in
 * version 1's header: a0 = A[g][2t,+1], a1 = A[g+8][..], a2 = A[g][2t+8,+9], a3 = A[g+8][..];
 * b0 = B[2t,+1][g], b1 = B[2t+8,+9][g]; c0, c1 = C[g][2t,+1], c2, c3 = C[g+8][..]) */
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8x8 BF16 matrices from shared memory. Lane l gives the address of row l % 8 of matrix
 * l / 8 (16 contiguous bytes); lane 4r + c receives, in r[i], elements (row r, cols 2c, 2c + 1)
 * of matrix i, low half first: exactly an A or B fragment register of the mma above. */
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t *p) {
    unsigned addr = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* The same, transposed: lane 4r + c receives (row 2c, col r) and (row 2c + 1, col r). */
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
template <int N> __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* two floats -> packed BF16 pair (round-to-nearest-even), lo in the low 16 bits */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* 2^x in one MUFU.EX2 (ex2.approx.ftz: results below 2^-126 flush to zero); exp2f compiles to
 * MUFU.EX2 plus a compare and two predicated multiplies that keep subnormal results */
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* ---- v2 kernels ---- */

constexpr int KT = 64;       /* keys per key tile, query rows per query tile: Tp's unit */
constexpr int THREADS = 128; /* 4 warps */
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

/* Variants (template arguments of every kernel below):
 *   FAST = false: version 2, version 1's arithmetic (bit-identical);
 *   FAST = true:  version 3, exponentials through ex2_ftz, and the forward folds the scale into
 *                 the exponent (p = 2^(S * scale * log2e - m) as one FFMA + MUFU on the raw
 *                 score; the row max is taken on raw scores and scaled once, the same value by
 *                 monotonic rounding). Not bit-identical: arguments differ by an FP32 rounding.
 *   HM: head-major grid (ceil(Tp / ROWS), BH) instead of (BH, ceil(Tp / ROWS)): consecutive
 *       blocks are the tiles of one head (longest first), so the blocks running at once share
 *       K, V (or Q, dO) in L2 instead of each reading another head's (version 5). BH <= 65535.
 *   MT: m16 tiles per warp, 2 by default for head sizes <= 64 (each B fragment read from
 *       shared memory feeds two mma; more registers: 2 blocks of 4 warps per SM), else 1
 *       (version 4 takes 1 for every head size: 16 rows per warp like version 1, fewer
 *       registers, more blocks per SM). A block covers ROWS = 4 warps x 16 MT query rows
 *       (forward, dq) or keys (dk/dv). */
template <bool FAST> __device__ __forceinline__ float exp2_v(float x) {
    if constexpr (FAST)
        return ex2_ftz(x);
    else
        return exp2f(x);
}

/* the default m16 tiles per warp: two where the accumulators fit in registers */
template <int D> constexpr int default_mt(void) { return D <= 64 ? 2 : 1; }

/* Where a backward kernel writes head bh's row t of dq, dk or dv (as version 1's fl_out):
 * p + (bh / NH) * sB + (bh % NH) * sH + t * sT. */
struct fl_out {
    float *p;
    size_t sB, sH, sT;
    int NH;
};

__device__ __forceinline__ float *fl_row(const fl_out &o, int bh, int t) {
    return o.p + (size_t)(bh / o.NH) * o.sB + (size_t)(bh % o.NH) * o.sH + (size_t)t * o.sT;
}

/* Rows [0, R) of a BF16 [.., D] row-major matrix at g (row stride D) into shared s[R][D + 8]
 * with cp.async; every thread of the block takes part. Thread tid copies the 16-byte chunk
 * tid % CPR of rows tid / CPR + i * (THREADS / CPR): the addresses are one base per thread plus
 * compile-time offsets (version 1 divides the chunk index for every copy, ~14 integer
 * instructions per cp.async). */
template <int D, int R>
__device__ __forceinline__ void cp_rows(uint16_t *s, const uint16_t *g, int tid) {
    constexpr int LDT = D + 8, CPR = D / 8,
                  RPP = THREADS / CPR; /* chunks per row, rows per pass */
    static_assert(THREADS % CPR == 0 && R % RPP == 0, "every thread copies R / RPP chunks");
    const unsigned r = (unsigned)tid / CPR, cc = (unsigned)tid % CPR;
    uint16_t *sp = s + r * LDT + 8 * cc;
    const uint16_t *gp = g + r * D + 8 * cc;
#pragma unroll
    for (int i = 0; i < R / RPP; i++) cp_async16(sp + i * RPP * LDT, gp + i * RPP * D);
}
/* n rows, n = R or 64 (a block's last tile when Tp / 64 is odd) */
template <int D, int R>
__device__ __forceinline__ void cp_block_rows(uint16_t *s, const uint16_t *g, int n, int tid) {
    if (R == KT || n == R)
        cp_rows<D, R>(s, g, tid);
    else
        cp_rows<D, KT>(s, g, tid);
}

/* A fragment (16 x 16) of a row-major shared tile at s (its row 0, col 0), row pitch ld */
__device__ __forceinline__ void lds_a(uint32_t (&a)[4], const uint16_t *s, int ld, int lane) {
    /* matrices a0..a3 = (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) */
    ldsm_x4(a, s + (lane & 15) * ld + 8 * (lane >> 4));
}

/* s[m][j] += A_m (16 x D) * B^T for the warp's MT m16 tiles and NJ key n-tiles: B is a shared
 * tile [n = key][k = d] (pitch D + 8) at its row 0; A_m comes from registers af[m][kk]
 * (A_REGS) or is loaded from the shared tile As (row-major, pitch D + 8, m16 tile m at row 16m).
 * Each B fragment is loaded once and used for all MT tiles. Per s element the k-steps are
 * accumulated in order kk = 0, 1, .. (version 1's order). */
template <int D, int MT, int NJ, bool A_REGS>
__device__ __forceinline__ void scores(float (&s)[MT][NJ][4], const uint32_t (&af)[MT][D / 16][4],
                                       const uint16_t *As, const uint16_t *Bs, int lane) {
    constexpr int LDT = D + 8;
    /* x4 of B: matrices (n-tile 2j2, k lo), (2j2, k hi), (2j2 + 1, k lo), (2j2 + 1, k hi), i.e.
     * lane l addresses key 16 j2 + (l & 7) + 8 (l >> 4), dims 16 kk + 8 ((l >> 3) & 1) */
    const uint16_t *brow = Bs + ((lane & 7) + ((lane >> 4) << 3)) * LDT + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; m++) {
            if constexpr (A_REGS) {
#pragma unroll
                for (int i = 0; i < 4; i++) a[m][i] = af[m][kk][i];
            } else {
                lds_a(a[m], As + 16 * m * LDT + 16 * kk, LDT, lane);
            }
        }
#pragma unroll
        for (int j2 = 0; j2 < NJ / 2; j2++) {
            uint32_t b[4];
            ldsm_x4(b, brow + 16 * j2 * LDT + 16 * kk);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                mma_bf16(s[m][2 * j2], a[m], b[0], b[1]);
                mma_bf16(s[m][2 * j2 + 1], a[m], b[2], b[3]);
            }
        }
    }
}

/* acc[m][n] (n < D/8: dims 8n..8n+7) += P_m (16 x 16 NK) * M (16 NK x D) for the warp's MT m16
 * tiles, P_m given as C fragments p[m][j] (j < 2 NK: columns 8j..8j+7) — C fragments of two
 * adjacent n-tiles are the A fragment of one 16-wide k-step once packed to BF16 — and M a shared
 * tile [k = row][n = d] (pitch D + 8) at its row 0, read with ldmatrix.trans (lane l addresses
 * row 16 kk + (l & 15), dims 16 n2 + 8 (l >> 4): b0, b1 of n-tiles 2 n2 and 2 n2 + 1). Per acc
 * element the k-steps are accumulated in order kk = 0, 1, .. */
template <int D, int MT, int NK>
__device__ __forceinline__ void pv_acc(float (&acc)[MT][D / 8][4],
                                       const float (&p)[MT][2 * NK][4], const uint16_t *Ms,
                                       int lane) {
    constexpr int LDT = D + 8;
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
        uint32_t a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; m++) {
            a[m][0] = pack_bf16x2(p[m][2 * kk][0], p[m][2 * kk][1]);         /* row g,   2t */
            a[m][1] = pack_bf16x2(p[m][2 * kk][2], p[m][2 * kk][3]);         /* row g+8, 2t */
            a[m][2] = pack_bf16x2(p[m][2 * kk + 1][0], p[m][2 * kk + 1][1]); /* row g, 2t+8 */
            a[m][3] = pack_bf16x2(p[m][2 * kk + 1][2], p[m][2 * kk + 1][3]); /* row g+8, .. */
        }
        const uint16_t *mrow = Ms + (16 * kk + (lane & 15)) * LDT + 8 * (lane >> 4);
#pragma unroll
        for (int n2 = 0; n2 < D / 16; n2++) {
            uint32_t b[4];
            ldsm_x4_trans(b, mrow + 16 * n2);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                mma_bf16(acc[m][2 * n2], a[m], b[0], b[1]);
                mma_bf16(acc[m][2 * n2 + 1], a[m], b[2], b[3]);
            }
        }
    }
}

/* One key tile of the forward for the warp's MT m16 tiles (rows lrow + 16m + g and + 8 of the
 * tile's 64-row frame; kbase = the tile's first key): version 1's loop body, per m16 tile in the
 * same order. DIAG: the warp's diagonal tile, where keys after the row (and keys >= T) are
 * masked; every other tile is unmasked. */
template <int D, int MT, bool DIAG, bool FAST>
__device__ __forceinline__ void
fwd_tile(float (&o)[MT][D / 8][4], float (&mrow)[MT][2], float (&lsum)[MT][2],
         const uint32_t (&qf)[MT][D / 16][4], const uint16_t *Qw, const uint16_t *Kc,
         const uint16_t *Vc, int lane, int lrow, int kbase, int T, float scale_log2) {
    const int g = lane >> 2, t = lane & 3;
    float s[MT][8][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < 8; j++) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.f;
    scores<D, MT, 8, (D <= 64)>(s, qf, Qw, Kc, lane);

    if (!FAST) { /* version 1: scale to base 2 first (FAST: inside the exponent's FFMA) */
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[m][j][e] *= scale_log2;
    }
    if (DIAG) {
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = 8 * j + 2 * t + (e & 1);
                    int row = lrow + 16 * m + g + 8 * (e >> 1);
                    if (key > row || kbase + key >= T) s[m][j][e] = -INFINITY;
                }
    }

#pragma unroll
    for (int m = 0; m < MT; m++) {
        float mx0, mx1;
        if (!FAST) {
            mx0 = mrow[m][0], mx1 = mrow[m][1];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                mx0 = fmaxf(mx0, fmaxf(s[m][j][0], s[m][j][1]));
                mx1 = fmaxf(mx1, fmaxf(s[m][j][2], s[m][j][3]));
            }
            mx0 = quad_max(mx0);
            mx1 = quad_max(mx1);
        } else { /* max of the raw scores, scaled once: max(round(c s)) = round(c max(s)) */
            float r0 = -INFINITY, r1 = -INFINITY;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                r0 = fmaxf(r0, fmaxf(s[m][j][0], s[m][j][1]));
                r1 = fmaxf(r1, fmaxf(s[m][j][2], s[m][j][3]));
            }
            mx0 = fmaxf(mrow[m][0], quad_max(r0) * scale_log2);
            mx1 = fmaxf(mrow[m][1], quad_max(r1) * scale_log2);
        }
        /* a row with nothing unmasked yet keeps m = -inf; subtract 0 then (no -inf - -inf) */
        float mu0 = mx0 == -INFINITY ? 0.f : mx0, mu1 = mx1 == -INFINITY ? 0.f : mx1;
        float alpha0 = exp2_v<FAST>(mrow[m][0] - mu0), alpha1 = exp2_v<FAST>(mrow[m][1] - mu1);
        mrow[m][0] = mx0, mrow[m][1] = mx1;
        float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (!FAST) {
                s[m][j][0] = exp2f(s[m][j][0] - mu0);
                s[m][j][1] = exp2f(s[m][j][1] - mu0);
                s[m][j][2] = exp2f(s[m][j][2] - mu1);
                s[m][j][3] = exp2f(s[m][j][3] - mu1);
            } else {
                s[m][j][0] = ex2_ftz(__fmaf_rn(s[m][j][0], scale_log2, -mu0));
                s[m][j][1] = ex2_ftz(__fmaf_rn(s[m][j][1], scale_log2, -mu0));
                s[m][j][2] = ex2_ftz(__fmaf_rn(s[m][j][2], scale_log2, -mu1));
                s[m][j][3] = ex2_ftz(__fmaf_rn(s[m][j][3], scale_log2, -mu1));
            }
            rs0 += s[m][j][0] + s[m][j][1];
            rs1 += s[m][j][2] + s[m][j][3];
        }
        lsum[m][0] = lsum[m][0] * alpha0 + rs0;
        lsum[m][1] = lsum[m][1] * alpha1 + rs1;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o[m][n][0] *= alpha0, o[m][n][1] *= alpha0;
            o[m][n][2] *= alpha1, o[m][n][3] *= alpha1;
        }
    }
    pv_acc<D, MT, 4>(o, s, Vc, lane);
}

/* Forward. Grid (BH, ceil(Tp / ROWS)) (HM: transposed), block 128; query block qb = last -
 * blockIdx.y (the longest rows first). Warp w owns query rows qb * ROWS + 16 MT w + [0, 16 MT)
 * (none if that is >= Tp: the block's last 64 rows when Tp / 64 is odd). Shared: Q [ROWS][LDT] (for
 * head sizes <= 64 only read once into registers), K, V [2][64][LDT]. */
template <int D, bool FAST = false, int MT = default_mt<D>(), bool HM = false>
__global__ void __launch_bounds__(THREADS)
    flash_fwd_kernel(float *out, float *lse, const uint16_t *__restrict__ q,
                     const uint16_t *__restrict__ k, const uint16_t *__restrict__ v, int T,
                     int Tp, int NH, float scale_log2) {
    constexpr int BM = 4 * 16 * MT, LDT = D + 8, TILE = KT * LDT;
    extern __shared__ uint4 flash2_smem[];
    uint16_t *Qs = reinterpret_cast<uint16_t *>(flash2_smem); /* [BM][LDT] */
    uint16_t *Ks = Qs + BM * LDT;                             /* [2][64][LDT] */
    uint16_t *Vs = Ks + 2 * TILE;                             /* [2][64][LDT] */
    const int nQ = (Tp + BM - 1) / BM;
    const int bh = HM ? blockIdx.y : blockIdx.x,
              qb = nQ - 1 - (int)(HM ? blockIdx.x : blockIdx.y);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t base = (size_t)bh * Tp * D;
    const uint16_t *kb = k + base, *vb = v + base;
    const int q0 = qb * BM, nrows = min(BM, Tp - q0);
    const int ntiles = (q0 + nrows) / KT; /* key tiles 0 .. ntiles - 1 */
    const int wrow = q0 + 16 * MT * warp; /* the warp's first query row */
    const bool active = wrow < Tp;
    const int wtile = wrow / KT, lrow = wrow % KT; /* its diagonal key tile, row in that tile */
    const uint16_t *Qw = Qs + 16 * MT * warp * LDT;

    cp_block_rows<D, BM>(Qs, q + base + (size_t)q0 * D, nrows, tid);
    cp_async_commit();
    cp_rows<D, KT>(Ks, kb, tid);
    cp_rows<D, KT>(Vs, vb, tid);
    cp_async_commit();
    cp_async_wait<1>(); /* Q has landed */
    __syncthreads();

    /* head sizes <= 64: this warp's Q rows as A fragments, read once (rows of inactive warps
     * are unloaded shared memory inside the Q buffer: read but never used) */
    uint32_t qf[MT][D / 16][4];
    if constexpr (D <= 64) {
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                lds_a(qf[m][kk], Qw + 16 * m * LDT + 16 * kk, LDT, lane);
    }
    float o[MT][D / 8][4], mrow[MT][2], lsum[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++) {
#pragma unroll
        for (int n = 0; n < D / 8; n++) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.f;
        mrow[m][0] = mrow[m][1] = -INFINITY;
        lsum[m][0] = lsum[m][1] = 0.f;
    }

    for (int kt = 0; kt < ntiles; kt++) {
        int st = kt & 1;
        if (kt + 1 < ntiles) { /* prefetch the next K, V tile into the other stage */
            cp_rows<D, KT>(Ks + (st ^ 1) * TILE, kb + (size_t)(kt + 1) * KT * D, tid);
            cp_rows<D, KT>(Vs + (st ^ 1) * TILE, vb + (size_t)(kt + 1) * KT * D, tid);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint16_t *Kc = Ks + st * TILE, *Vc = Vs + st * TILE;
        if (active && kt < wtile)
            fwd_tile<D, MT, false, FAST>(o, mrow, lsum, qf, Qw, Kc, Vc, lane, lrow, kt * KT, T,
                                         scale_log2);
        else if (active && kt == wtile)
            fwd_tile<D, MT, true, FAST>(o, mrow, lsum, qf, Qw, Kc, Vc, lane, lrow, kt * KT, T,
                                        scale_log2);
        __syncthreads(); /* the stage is overwritten by the prefetch of iteration kt + 1 */
    }

    const int b = bh / NH, h = bh % NH;
    const size_t C = (size_t)NH * D;
#pragma unroll
    for (int m = 0; m < MT; m++) {
        float l0 = quad_sum(lsum[m][0]), l1 = quad_sum(lsum[m][1]);
        int row0 = wrow + 16 * m + g, row1 = row0 + 8;
        if (row0 < T) {
            float inv = 1.f / l0;
            float *orow = out + ((size_t)b * T + row0) * C + (size_t)h * D + 2 * t;
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *reinterpret_cast<float2 *>(orow + 8 * n) =
                    make_float2(o[m][n][0] * inv, o[m][n][1] * inv);
            if (t == 0) lse[(size_t)bh * T + row0] = (mrow[m][0] + log2f(l0)) * LN2;
        }
        if (row1 < T) {
            float inv = 1.f / l1;
            float *orow = out + ((size_t)b * T + row1) * C + (size_t)h * D + 2 * t;
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *reinterpret_cast<float2 *>(orow + 8 * n) =
                    make_float2(o[m][n][2] * inv, o[m][n][3] * inv);
            if (t == 0) lse[(size_t)bh * T + row1] = (mrow[m][1] + log2f(l1)) * LN2;
        }
    }
}

/* One key tile of dq, in steps of SW keys: S = Q K^T, dP = dO V^T (warp: 16 MT rows x SW keys),
 * P = exp2(S * scale * log2e - lse * log2e), dS = P (dP - Dv), dq += dS K; version 1's
 * per-element expressions. DIAG: the warp's diagonal tile (mask keys after the row and keys
 * >= T; a step all of whose keys are masked is skipped: it would add exact zeros). */
template <int D, int MT, int SW, bool DIAG, bool FAST>
__device__ __forceinline__ void
dq_tile(float (&acc)[MT][D / 8][4], const uint32_t (&qf)[MT][D / 16][4],
        const uint32_t (&df)[MT][D / 16][4], const uint16_t *Qw, const uint16_t *dOw,
        const uint16_t *Kc, const uint16_t *Vc, const float (&L)[MT][2], const float (&Dr)[MT][2],
        int lane, int lrow, int kbase, int T, float scale_log2) {
    constexpr int LDT = D + 8, NJ = SW / 8;
    constexpr bool A_REGS = D <= 64;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll 1 /* one step's scores live at a time (unrolled, ptxas overlaps the steps) */
    for (int h = 0; h < KT / SW; h++) {
        if (DIAG && (SW * h > lrow + 16 * MT - 1 || kbase + SW * h >= T)) continue;
        float s[MT][NJ][4], dp[MT][NJ][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.f;
                dp[m][j][0] = dp[m][j][1] = dp[m][j][2] = dp[m][j][3] = 0.f;
            }
        scores<D, MT, NJ, A_REGS>(s, qf, Qw, Kc + SW * h * LDT, lane);
        scores<D, MT, NJ, A_REGS>(dp, df, dOw, Vc + SW * h * LDT, lane);
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NJ; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = SW * h + 8 * j + 2 * t + (e & 1);
                    int row = lrow + 16 * m + g + 8 * (e >> 1);
                    float p = exp2_v<FAST>(s[m][j][e] * scale_log2 - L[m][e >> 1]);
                    if (DIAG && (key > row || kbase + key >= T)) p = 0.f;
                    s[m][j][e] = p * (dp[m][j][e] - Dr[m][e >> 1]); /* dS */
                }
        pv_acc<D, MT, SW / 16>(acc, s, Kc + SW * h * LDT, lane);
    }
}

/* dq per query block. Grid (BH, ceil(Tp / ROWS)) (HM: transposed), qb = last - blockIdx.y; loops
 * over key tiles up to the block's last diagonal. Shared: Q, dO [ROWS][LDT] (for head sizes <= 64
 * read once into registers), K, V [2][64][LDT]. Keys in steps of 32 when a warp holds two m16 tiles
 * (registers), else 64. */
template <int D, bool FAST = false, int MT = default_mt<D>(), bool HM = false>
__global__ void __launch_bounds__(THREADS)
    flash_bwd_dq_kernel(fl_out dq, const uint16_t *__restrict__ q, const uint16_t *__restrict__ k,
                        const uint16_t *__restrict__ v, const uint16_t *__restrict__ dout,
                        const float *__restrict__ lse, const float *__restrict__ Dv, int T,
                        int Tp, float scale, float scale_log2) {
    constexpr int BM = 4 * 16 * MT, LDT = D + 8, TILE = KT * LDT;
    constexpr int SW = MT == 2 ? 32 : 64;
    extern __shared__ uint4 flash2_smem[];
    uint16_t *Qs = reinterpret_cast<uint16_t *>(flash2_smem); /* [BM][LDT] */
    uint16_t *dOs = Qs + BM * LDT;                            /* [BM][LDT] */
    uint16_t *Ks = dOs + BM * LDT;                            /* [2][64][LDT] */
    uint16_t *Vs = Ks + 2 * TILE;                             /* [2][64][LDT] */
    const int nQ = (Tp + BM - 1) / BM;
    const int bh = HM ? blockIdx.y : blockIdx.x,
              qb = nQ - 1 - (int)(HM ? blockIdx.x : blockIdx.y);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t base = (size_t)bh * Tp * D;
    const uint16_t *kb = k + base, *vb = v + base;
    const int q0 = qb * BM, nrows = min(BM, Tp - q0);
    const int ntiles = (q0 + nrows) / KT;
    const int wrow = q0 + 16 * MT * warp;
    const bool active = wrow < Tp;
    const int wtile = wrow / KT, lrow = wrow % KT;
    const uint16_t *Qw = Qs + 16 * MT * warp * LDT, *dOw = dOs + 16 * MT * warp * LDT;

    cp_block_rows<D, BM>(Qs, q + base + (size_t)q0 * D, nrows, tid);
    cp_block_rows<D, BM>(dOs, dout + base + (size_t)q0 * D, nrows, tid);
    cp_async_commit();
    cp_rows<D, KT>(Ks, kb, tid);
    cp_rows<D, KT>(Vs, vb, tid);
    cp_async_commit();

    float L[MT][2], Dr[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int row = wrow + 16 * m + g + 8 * i;
            L[m][i] = row < T ? lse[(size_t)bh * T + row] * LOG2E : 0.f;
            Dr[m][i] = row < T ? Dv[(size_t)bh * T + row] : 0.f;
        }
    cp_async_wait<1>(); /* Q, dO have landed */
    __syncthreads();
    uint32_t qf[MT][D / 16][4], df[MT][D / 16][4];
    if constexpr (D <= 64) {
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                lds_a(qf[m][kk], Qw + 16 * m * LDT + 16 * kk, LDT, lane);
                lds_a(df[m][kk], dOw + 16 * m * LDT + 16 * kk, LDT, lane);
            }
    }
    float acc[MT][D / 8][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.f;

    for (int kt = 0; kt < ntiles; kt++) {
        int st = kt & 1;
        if (kt + 1 < ntiles) {
            cp_rows<D, KT>(Ks + (st ^ 1) * TILE, kb + (size_t)(kt + 1) * KT * D, tid);
            cp_rows<D, KT>(Vs + (st ^ 1) * TILE, vb + (size_t)(kt + 1) * KT * D, tid);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint16_t *Kc = Ks + st * TILE, *Vc = Vs + st * TILE;
        if (active && kt < wtile)
            dq_tile<D, MT, SW, false, FAST>(acc, qf, df, Qw, dOw, Kc, Vc, L, Dr, lane, lrow,
                                            kt * KT, T, scale_log2);
        else if (active && kt == wtile)
            dq_tile<D, MT, SW, true, FAST>(acc, qf, df, Qw, dOw, Kc, Vc, L, Dr, lane, lrow,
                                           kt * KT, T, scale_log2);
        __syncthreads();
    }

#pragma unroll
    for (int m = 0; m < MT; m++) {
        int row0 = wrow + 16 * m + g, row1 = row0 + 8;
        if (row0 < T) {
            float *o = fl_row(dq, bh, row0) + 2 * t;
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *reinterpret_cast<float2 *>(o + 8 * n) =
                    make_float2(acc[m][n][0] * scale, acc[m][n][1] * scale);
        }
        if (row1 < T) {
            float *o = fl_row(dq, bh, row1) + 2 * t;
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *reinterpret_cast<float2 *>(o + 8 * n) =
                    make_float2(acc[m][n][2] * scale, acc[m][n][3] * scale);
        }
    }
}

/* One query tile of dk, dv in steps of 32 queries, transposed scores (rows = the warp's keys
 * wkey + 16m + g (+8), columns = queries qbase + ..): S^T = K Q^T, dP^T = V dO^T,
 * P^T = exp2(S^T * scale * log2e - lse[query] * log2e), dS^T = P^T (dP^T - Dv[query]);
 * dv += P^T dO, dk += dS^T Q; version 1's per-element expressions. MASK: the warp's diagonal
 * tile or the last tile (queries before the key or >= T get P = 0; a step all of whose queries
 * are masked is skipped). Lc: lse * log2e, Dc: Dv of the tile's 64 queries. */
template <int D, int MT, bool MASK, bool FAST>
__device__ __forceinline__ void
dkdv_tile(float (&adk)[MT][D / 8][4], float (&adv)[MT][D / 8][4], const uint16_t *Kw,
          const uint16_t *Vw, const uint16_t *Qc, const uint16_t *dOc, const float *Lc,
          const float *Dc, int lane, int wkey, int qbase, int T, float scale_log2) {
    constexpr int LDT = D + 8, SW = 32, NJ = SW / 8;
    const int g = lane >> 2, t = lane & 3;
    uint32_t none[MT][D / 16][4]; /* K, V fragments come from shared memory */
#pragma unroll 1 /* one step's scores live at a time (unrolled, ptxas overlaps the steps) */
    for (int h = 0; h < KT / SW; h++) {
        if (MASK && (qbase + SW * h + SW - 1 < wkey || qbase + SW * h >= T)) continue;
        float s[MT][NJ][4], dp[MT][NJ][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.f;
                dp[m][j][0] = dp[m][j][1] = dp[m][j][2] = dp[m][j][3] = 0.f;
            }
        scores<D, MT, NJ, false>(s, none, Kw, Qc + SW * h * LDT, lane);   /* S^T */
        scores<D, MT, NJ, false>(dp, none, Vw, dOc + SW * h * LDT, lane); /* dP^T */
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            int lq = SW * h + 8 * j + 2 * t; /* query within the tile (and lq + 1) */
            float2 Lq = *reinterpret_cast<const float2 *>(Lc + lq);
            float2 Dq = *reinterpret_cast<const float2 *>(Dc + lq);
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int query = qbase + lq + (e & 1);
                    int key = wkey + 16 * m + g + 8 * (e >> 1);
                    float Lv = (e & 1) ? Lq.y : Lq.x, Dvv = (e & 1) ? Dq.y : Dq.x;
                    float p = exp2_v<FAST>(s[m][j][e] * scale_log2 - Lv);
                    if (MASK && (query < key || query >= T)) p = 0.f;
                    s[m][j][e] = p;                        /* P^T */
                    dp[m][j][e] = p * (dp[m][j][e] - Dvv); /* dS^T */
                }
        }
        pv_acc<D, MT, SW / 16>(adv, s, dOc + SW * h * LDT, lane);
        pv_acc<D, MT, SW / 16>(adk, dp, Qc + SW * h * LDT, lane);
    }
}

/* dk, dv per key block. Grid (BH, ceil(Tp / ROWS)) (HM: transposed), kb = blockIdx.y (the most
 * query tiles first); loops over the query tiles from the block's first diagonal on. Warp w owns
 * keys kb * ROWS + 16 MT w + [0, 16 MT) (none if >= Tp). Shared: K, V [ROWS][LDT] (loaded once), Q,
 * dO [2][64][LDT], lse * log2e and Dv of the query tile [2][64] FP32 (the next tile's loaded into
 * registers while the current one is computed). */
template <int D, bool FAST = false, int MT = default_mt<D>(), bool HM = false>
__global__ void __launch_bounds__(THREADS)
    flash_bwd_dkdv_kernel(fl_out dk, fl_out dv, const uint16_t *__restrict__ q,
                          const uint16_t *__restrict__ k, const uint16_t *__restrict__ v,
                          const uint16_t *__restrict__ dout, const float *__restrict__ lse,
                          const float *__restrict__ Dv, int T, int Tp, float scale,
                          float scale_log2) {
    constexpr int BN = 4 * 16 * MT, LDT = D + 8, TILE = KT * LDT;
    extern __shared__ uint4 flash2_smem[];
    uint16_t *Ks = reinterpret_cast<uint16_t *>(flash2_smem); /* [BN][LDT] */
    uint16_t *Vs = Ks + BN * LDT;                             /* [BN][LDT] */
    uint16_t *Qs = Vs + BN * LDT;                             /* [2][64][LDT] */
    uint16_t *dOs = Qs + 2 * TILE;                            /* [2][64][LDT] */
    float *Ls = reinterpret_cast<float *>(dOs + 2 * TILE);    /* [2][64] lse * log2e */
    float *Ds = Ls + 2 * KT;                                  /* [2][64] Dv */
    const int nT = Tp / KT;
    const int bh = HM ? blockIdx.y : blockIdx.x, kb = (int)(HM ? blockIdx.x : blockIdx.y);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t base = (size_t)bh * Tp * D;
    const uint16_t *qb = q + base, *dob = dout + base;
    const float *lseb = lse + (size_t)bh * T, *Dvb = Dv + (size_t)bh * T;
    const int k0 = kb * BN, nrows = min(BN, Tp - k0);
    const int qt0 = k0 / KT;              /* the block's first query tile */
    const int wkey = k0 + 16 * MT * warp; /* the warp's first key */
    const bool active = wkey < Tp;
    const int wtile = wkey / KT; /* its diagonal query tile */
    const uint16_t *Kw = Ks + 16 * MT * warp * LDT, *Vw = Vs + 16 * MT * warp * LDT;

    cp_block_rows<D, BN>(Ks, k + base + (size_t)k0 * D, nrows, tid);
    cp_block_rows<D, BN>(Vs, v + base + (size_t)k0 * D, nrows, tid);
    cp_rows<D, KT>(Qs, qb + (size_t)qt0 * KT * D, tid);
    cp_rows<D, KT>(dOs, dob + (size_t)qt0 * KT * D, tid);
    cp_async_commit();
    if (tid < KT) {
        int row = qt0 * KT + tid;
        Ls[tid] = row < T ? lseb[row] * LOG2E : 0.f;
        Ds[tid] = row < T ? Dvb[row] : 0.f;
    }

    float adk[MT][D / 8][4], adv[MT][D / 8][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            adk[m][n][0] = adk[m][n][1] = adk[m][n][2] = adk[m][n][3] = 0.f;
            adv[m][n][0] = adv[m][n][1] = adv[m][n][2] = adv[m][n][3] = 0.f;
        }

    for (int qt = qt0; qt < nT; qt++) {
        const int st = (qt - qt0) & 1, nx = st ^ 1;
        float nextL = 0.f, nextD = 0.f;
        if (qt + 1 < nT) {
            cp_rows<D, KT>(Qs + nx * TILE, qb + (size_t)(qt + 1) * KT * D, tid);
            cp_rows<D, KT>(dOs + nx * TILE, dob + (size_t)(qt + 1) * KT * D, tid);
            cp_async_commit();
            if (tid < KT) { /* into registers now, into shared memory after this tile */
                int row = (qt + 1) * KT + tid;
                nextL = row < T ? lseb[row] * LOG2E : 0.f;
                nextD = row < T ? Dvb[row] : 0.f;
            }
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint16_t *Qc = Qs + st * TILE, *dOc = dOs + st * TILE;
        const float *Lc = Ls + st * KT, *Dc = Ds + st * KT;
        if (active && qt >= wtile) {
            if (qt == wtile || qt == nT - 1)
                dkdv_tile<D, MT, true, FAST>(adk, adv, Kw, Vw, Qc, dOc, Lc, Dc, lane, wkey,
                                             qt * KT, T, scale_log2);
            else
                dkdv_tile<D, MT, false, FAST>(adk, adv, Kw, Vw, Qc, dOc, Lc, Dc, lane, wkey,
                                              qt * KT, T, scale_log2);
        }
        if (qt + 1 < nT && tid < KT) { /* stage nx was last read before the previous barrier */
            Ls[nx * KT + tid] = nextL;
            Ds[nx * KT + tid] = nextD;
        }
        __syncthreads();
    }

#pragma unroll
    for (int m = 0; m < MT; m++) {
        int key0 = wkey + 16 * m + g, key1 = key0 + 8;
        if (key0 < T) {
            float *ok = fl_row(dk, bh, key0) + 2 * t;
            float *ov = fl_row(dv, bh, key0) + 2 * t;
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                *reinterpret_cast<float2 *>(ok + 8 * n) =
                    make_float2(adk[m][n][0] * scale, adk[m][n][1] * scale);
                *reinterpret_cast<float2 *>(ov + 8 * n) = make_float2(adv[m][n][0], adv[m][n][1]);
            }
        }
        if (key1 < T) {
            float *ok = fl_row(dk, bh, key1) + 2 * t;
            float *ov = fl_row(dv, bh, key1) + 2 * t;
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                *reinterpret_cast<float2 *>(ok + 8 * n) =
                    make_float2(adk[m][n][2] * scale, adk[m][n][3] * scale);
                *reinterpret_cast<float2 *>(ov + 8 * n) = make_float2(adv[m][n][2], adv[m][n][3]);
            }
        }
    }
}

/* ---- v2 host side ---- */

/* shared-memory bytes of each kernel (BF16 rows of pitch D + 8; ROWS = 64 MT) */
static size_t fwd_smem(int D, int MT) { return (size_t)(64 * MT + 4 * KT) * (D + 8) * 2; }
static size_t dq_smem(int D, int MT) { return (size_t)(2 * 64 * MT + 4 * KT) * (D + 8) * 2; }
static size_t dkdv_smem(int D, int MT) {
    return (size_t)(2 * 64 * MT + 4 * KT) * (D + 8) * 2 + (size_t)4 * KT * sizeof(float);
}
/* query blocks (forward, dq) = key blocks (dk/dv) */
static int row_blocks(int Tp, int MT) { return (Tp + 64 * MT - 1) / (64 * MT); }
/* the grid of every kernel: (BH, row blocks), or (row blocks, BH) head-major */
static dim3 grid_of(int BH, int Tp, int MT, bool HM) {
    return HM ? dim3(row_blocks(Tp, MT), BH) : dim3(BH, row_blocks(Tp, MT));
}

/* Raise the dynamic shared-memory limit of the kernels of a variant, once. */
template <int D, bool FAST, int MT, bool HM> static void flash_setup(void) {
    static int done = 0;
    if (done) return;
    CUDA_CHECK(cudaFuncSetAttribute(flash_fwd_kernel<D, FAST, MT, HM>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fwd_smem(D, MT)));
    CUDA_CHECK(cudaFuncSetAttribute(flash_bwd_dq_kernel<D, FAST, MT, HM>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dq_smem(D, MT)));
    CUDA_CHECK(cudaFuncSetAttribute(flash_bwd_dkdv_kernel<D, FAST, MT, HM>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dkdv_smem(D, MT)));
    done = 1;
}

} /* namespace v2 */

/* ==== the ladder: dispatch, data, CPU reference, checks, timing ==== */

#define N_VERSIONS 6
static const char *const VERSION_NOTE[N_VERSIONS + 1] = {
    "",
    "previously shipped, still the HS 128 forward (64-row tiles, 16 rows per warp, 32-bit loads)",
    "ldmatrix, 2 m16 tiles per warp (HS <= 64), diagonal-only masks, 32-wide backward steps",
    "v2 + ex2.approx.ftz exponentials, forward scale folded into the exponent's FFMA (shipped)",
    "v3 with one m16 tile per warp for every head size (16 rows per warp, 64-row blocks)",
    "v3 with a head-major grid (a head's tiles in consecutive blocks: K/V or Q/dO shared in L2)",
    "v4 with the head-major grid of v5 (one m16 tile per warp, head-major)"};
/* versions whose results must equal version 1's bit for bit (the others: within tolerance) */
static const int BIT_IDENTICAL[N_VERSIONS + 1] = {1, 1, 1, 0, 0, 0, 0};

/* a dq / dk / dv row layout, converted to each version's fl_out */
struct layout {
    float *p;
    size_t sB, sH, sT;
    int NH;
};
template <class O> static O as_fl_out(const layout &l) {
    O o;
    o.p = l.p, o.sB = l.sB, o.sH = l.sH, o.sT = l.sT, o.NH = l.NH;
    return o;
}

struct problem {
    int B, NH, T, D, Tp, BH;
    float scale;
};
static problem make_problem(int B, int NH, int T, int D) {
    problem p;
    p.B = B, p.NH = NH, p.T = T, p.D = D;
    p.Tp = (T + 63) / 64 * 64;
    p.BH = B * NH;
    p.scale = 1.0f / sqrtf((float)D);
    return p;
}

/* versions 2.. are variants of the v2 kernels: f(variant<FAST, MT, HM>{}) */
template <bool FAST_, int MT_, bool HM_> struct variant {
    static constexpr bool FAST = FAST_, HM = HM_;
    static constexpr int MT = MT_;
};
template <int D, class F> static void with_variant(int ver, F f) {
    constexpr int M = v2::default_mt<D>();
    if (ver == 2)
        f(variant<false, M, false>{});
    else if (ver == 3)
        f(variant<true, M, false>{});
    else if (ver == 4)
        f(variant<true, 1, false>{});
    else if (ver == 5)
        f(variant<true, M, true>{});
    else
        f(variant<true, 1, true>{});
}

template <int D>
static void fwd_d(int ver, const problem &P, float *out, float *lse, const uint16_t *q,
                  const uint16_t *k, const uint16_t *v) {
    float scale_log2 = P.scale * 1.4426950408889634f; /* as cuda_attn_flash_fwd */
    if (ver == 1) {
        v1::flash_setup<D>();
        dim3 grid(P.BH, P.Tp / 64);
        v1::flash_fwd_kernel<D>
            <<<grid, 128, v1::fwd_smem(D)>>>(out, lse, q, k, v, P.T, P.Tp, P.NH, scale_log2);
    } else {
        with_variant<D>(ver, [&](auto V) {
            using Var = decltype(V);
            v2::flash_setup<D, Var::FAST, Var::MT, Var::HM>();
            v2::flash_fwd_kernel<D, Var::FAST, Var::MT, Var::HM>
                <<<v2::grid_of(P.BH, P.Tp, Var::MT, Var::HM), 128, v2::fwd_smem(D, Var::MT)>>>(
                    out, lse, q, k, v, P.T, P.Tp, P.NH, scale_log2);
        });
    }
    CUDA_CHECK(cudaGetLastError());
}

/* which: 1 = dk/dv kernel, 2 = dq kernel, 3 = both (dk/dv first, as the shipped backward) */
template <int D>
static void bwd_d(int ver, int which, const problem &P, const layout &dq, const layout &dk,
                  const layout &dv, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                  const uint16_t *dout, const float *lse, const float *Dv) {
    float scale = P.scale, scale_log2 = scale * 1.4426950408889634f;
    if (ver == 1) {
        v1::flash_setup<D>();
        dim3 grid(P.BH, P.Tp / 64);
        if (which & 1)
            v1::flash_bwd_dkdv_kernel<D><<<grid, 128, v1::dkdv_smem(D)>>>(
                as_fl_out<v1::fl_out>(dk), as_fl_out<v1::fl_out>(dv), q, k, v, dout, lse, Dv, P.T,
                P.Tp, scale, scale_log2);
        if (which & 2)
            v1::flash_bwd_dq_kernel<D><<<grid, 128, v1::dq_smem(D)>>>(
                as_fl_out<v1::fl_out>(dq), q, k, v, dout, lse, Dv, P.T, P.Tp, scale, scale_log2);
    } else {
        with_variant<D>(ver, [&](auto V) {
            using Var = decltype(V);
            constexpr int MT = Var::MT;
            v2::flash_setup<D, Var::FAST, MT, Var::HM>();
            dim3 grid = v2::grid_of(P.BH, P.Tp, MT, Var::HM);
            if (which & 1)
                v2::flash_bwd_dkdv_kernel<D, Var::FAST, MT, Var::HM>
                    <<<grid, 128, v2::dkdv_smem(D, MT)>>>(
                        as_fl_out<v2::fl_out>(dk), as_fl_out<v2::fl_out>(dv), q, k, v, dout, lse,
                        Dv, P.T, P.Tp, scale, scale_log2);
            if (which & 2)
                v2::flash_bwd_dq_kernel<D, Var::FAST, MT, Var::HM>
                    <<<grid, 128, v2::dq_smem(D, MT)>>>(as_fl_out<v2::fl_out>(dq), q, k, v, dout,
                                                        lse, Dv, P.T, P.Tp, scale, scale_log2);
        });
    }
    CUDA_CHECK(cudaGetLastError());
}

static void run_fwd(int ver, const problem &P, float *out, float *lse, const uint16_t *q,
                    const uint16_t *k, const uint16_t *v) {
    if (P.D == 32)
        fwd_d<32>(ver, P, out, lse, q, k, v);
    else if (P.D == 64)
        fwd_d<64>(ver, P, out, lse, q, k, v);
    else
        fwd_d<128>(ver, P, out, lse, q, k, v);
}
static void run_bwd(int ver, int which, const problem &P, const layout *g, const uint16_t *q,
                    const uint16_t *k, const uint16_t *v, const uint16_t *dout, const float *lse,
                    const float *Dv) {
    if (P.D == 32)
        bwd_d<32>(ver, which, P, g[0], g[1], g[2], q, k, v, dout, lse, Dv);
    else if (P.D == 64)
        bwd_d<64>(ver, which, P, g[0], g[1], g[2], q, k, v, dout, lse, Dv);
    else
        bwd_d<128>(ver, which, P, g[0], g[1], g[2], q, k, v, dout, lse, Dv);
}

/* Dv[bh, t] = sum_d dout[bh, t, d] * out[b, t, h * D + d] (FP32, fixed order; the backward's
 * input, computed once per problem from version 1's out so every version gets the same) */
__global__ void rowdot_kernel(float *Dv, const uint16_t *__restrict__ dout,
                              const float *__restrict__ out, int BH, int T, int Tp, int NH,
                              int D) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)BH * T) return;
    int bh = (int)(i / T), t = (int)(i % T), b = bh / NH, h = bh % NH;
    const uint16_t *d = dout + ((size_t)bh * Tp + t) * D;
    const float *o = out + ((size_t)b * T + t) * NH * D + (size_t)h * D;
    float acc = 0.f;
    for (int e = 0; e < D; e++) acc += __uint_as_float((uint32_t)d[e] << 16) * o[e];
    Dv[i] = acc;
}

/* ---- host data ---- */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}
static uint16_t bf16_rne(float f) { /* finite inputs only */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf16_to_f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* [BH, Tp, D] BF16, uniform with variance 1 times `gain` (head 1 of q gets 4: peaked softmax
 * rows), rows >= T zero */
static void fill_bf16(std::vector<uint16_t> &x, const problem &P, bool is_q) {
    x.assign((size_t)P.BH * P.Tp * P.D, 0);
    for (int bh = 0; bh < P.BH; bh++) {
        float gain = (is_q && bh == 1) ? 4.0f : 1.0f;
        for (int t = 0; t < P.T; t++)
            for (int d = 0; d < P.D; d++) {
                float u = (rng_u32() >> 8) * (1.0f / 16777216.0f); /* [0, 1) */
                x[((size_t)bh * P.Tp + t) * P.D + d] =
                    bf16_rne(gain * 1.7320508f * (2.f * u - 1.f));
            }
    }
}

/* causal attention of head bh in double on the BF16 inputs: out, lse and, given dout, the
 * gradients (all [T][D] / [T]) */
struct ref_head {
    std::vector<double> out, lse, dq, dk, dv;
};
static void ref_attention(ref_head &r, const problem &P, int bh, const std::vector<uint16_t> &q,
                          const std::vector<uint16_t> &k, const std::vector<uint16_t> &v,
                          const std::vector<uint16_t> &dout) {
    const int T = P.T, D = P.D;
    const double scale = 1.0 / sqrt((double)D);
    auto at = [&](const std::vector<uint16_t> &x, int t, int d) {
        return (double)bf16_to_f(x[((size_t)bh * P.Tp + t) * D + d]);
    };
    std::vector<double> qd((size_t)T * D), kd((size_t)T * D), vd((size_t)T * D),
        dod((size_t)T * D);
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++) {
            qd[(size_t)t * D + d] = at(q, t, d), kd[(size_t)t * D + d] = at(k, t, d);
            vd[(size_t)t * D + d] = at(v, t, d), dod[(size_t)t * D + d] = at(dout, t, d);
        }
    r.out.assign((size_t)T * D, 0.0), r.lse.assign(T, 0.0);
    r.dq.assign((size_t)T * D, 0.0), r.dk.assign((size_t)T * D, 0.0),
        r.dv.assign((size_t)T * D, 0.0);
    std::vector<double> p(T), dp(T);
    for (int i = 0; i < T; i++) {
        const double *qi = &qd[(size_t)i * D], *doi = &dod[(size_t)i * D];
        double m = -INFINITY;
        for (int j = 0; j <= i; j++) {
            double s = 0;
            for (int d = 0; d < D; d++) s += qi[d] * kd[(size_t)j * D + d];
            p[j] = s * scale;
            m = fmax(m, p[j]);
        }
        double l = 0;
        for (int j = 0; j <= i; j++) l += (p[j] = exp(p[j] - m));
        r.lse[i] = m + log(l);
        double *oi = &r.out[(size_t)i * D];
        for (int j = 0; j <= i; j++) {
            p[j] /= l;
            for (int d = 0; d < D; d++) oi[d] += p[j] * vd[(size_t)j * D + d];
        }
        double Dvi = 0;
        for (int d = 0; d < D; d++) Dvi += doi[d] * oi[d];
        for (int j = 0; j <= i; j++) {
            double s = 0;
            for (int d = 0; d < D; d++) s += doi[d] * vd[(size_t)j * D + d];
            double ds = p[j] * (s - Dvi);
            for (int d = 0; d < D; d++) {
                r.dq[(size_t)i * D + d] += scale * ds * kd[(size_t)j * D + d];
                r.dk[(size_t)j * D + d] += scale * ds * qi[d];
                r.dv[(size_t)j * D + d] += p[j] * doi[d];
            }
        }
    }
}

/* ---- checks ---- */
static int n_pass, n_fail, verbose;
static int version_failed[N_VERSIONS + 1];
/* the checks of one version on one shape: a failure prints its own line at once (so does a
 * pass with `verbose`); the passes are summed up in one line by summarize() */
static int group_pass, group_fail;
static char group_errs[256];

static void report(int ver, int ok, const char *what, const char *shape, const char *detail) {
    if (!ok || verbose)
        printf("%s v%d %s [%s]%s%s\n", ok ? "PASS" : "FAIL", ver, what, shape,
               detail[0] ? ": " : "", detail);
    if (ok)
        n_pass++, group_pass++;
    else
        n_fail++, group_fail++, version_failed[ver]++;
}
static void summarize(int ver, const char *shape) {
    printf("%s v%d [%s]: %d of %d checks passed;%s\n", group_fail ? "FAIL" : "PASS", ver, shape,
           group_pass, group_pass + group_fail, group_errs);
    group_pass = group_fail = 0;
    group_errs[0] = 0;
}
/* a measured error into the summary line */
static void note_err(const char *label, double err) {
    size_t n = strlen(group_errs);
    snprintf(group_errs + n, sizeof(group_errs) - n, " %s %.1e", label, err);
}

/* max |got - ref| / max |ref| (absolute when abs_tol) over n values; NaN fails. label: the
 * error's name in the summary line. */
static void check_close(int ver, const char *what, const char *label, const char *shape,
                        const float *got, const double *ref, size_t n, double tol, int abs_tol) {
    double maxref = 0, maxerr = 0;
    size_t bad_at = 0, nonfinite = 0;
    for (size_t i = 0; i < n; i++) maxref = fmax(maxref, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            if (!nonfinite++) bad_at = i;
            continue;
        }
        double e = fabs((double)got[i] - ref[i]);
        if (e > maxerr) maxerr = e, bad_at = i;
    }
    double err = abs_tol ? maxerr : maxerr / (maxref > 0 ? maxref : 1.0);
    char detail[160];
    snprintf(detail, sizeof(detail), "err %.3g (tol %.3g%s), worst at %zu: %.6g vs %.6g%s", err,
             tol, abs_tol ? " abs" : " of max", bad_at, n ? (double)got[bad_at] : 0.0,
             n ? ref[bad_at] : 0.0, nonfinite ? ", NON-FINITE values" : "");
    note_err(label, nonfinite ? NAN : err);
    report(ver, !nonfinite && err <= tol, what, shape, detail);
}

static void check_bits(int ver, const char *what, const char *label, const char *shape,
                       const void *a, const void *b, size_t bytes) {
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    size_t diff = 0, first = 0;
    for (size_t i = 0; i < bytes; i++)
        if (x[i] != y[i] && !diff++) first = i;
    char detail[96] = "";
    if (diff)
        snprintf(detail, sizeof(detail), "%zu bytes differ from v1, first at byte %zu", diff,
                 first);
    report(ver, !diff, what, shape, detail);
    size_t n = strlen(group_errs);
    snprintf(group_errs + n, sizeof(group_errs) - n, " %s %s", label, diff ? "DIFFERS" : "same");
}

#define GUARD_FLOATS 64
static const uint32_t SENTINEL = 0xFFFFFFFFu; /* a NaN: any unwritten value fails the checks */

/* device buffers of one problem */
struct dev_problem {
    problem P;
    uint16_t *q, *k, *v, *dout; /* [BH, Tp, D] each */
    float *out, *lse;           /* the forward's outputs, each followed by GUARD_FLOATS */
    float *bwd_lse, *Dv; /* the backward's inputs: version 1's lse and rowsum(dout * out) */
    float *grads;        /* dq, dk, dv: 3 * BH * T * D, then GUARD_FLOATS */
    size_t n_in, n_out, n_lse, n_grads;
    layout g[3];
};
static void dev_alloc(dev_problem &d, const problem &P, int token_major) {
    d.P = P;
    d.n_in = (size_t)P.BH * P.Tp * P.D;
    d.n_out = (size_t)P.BH * P.T * P.D;
    d.n_lse = (size_t)P.BH * P.T;
    d.n_grads = 3 * d.n_out + GUARD_FLOATS;
    CUDA_CHECK(cudaMalloc(&d.q, 4 * d.n_in * sizeof(uint16_t)));
    d.k = d.q + d.n_in, d.v = d.k + d.n_in, d.dout = d.v + d.n_in;
    CUDA_CHECK(cudaMalloc(&d.out, (d.n_out + GUARD_FLOATS) * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d.lse, (3 * d.n_lse + GUARD_FLOATS) * sizeof(float)));
    d.bwd_lse = d.lse + d.n_lse + GUARD_FLOATS, d.Dv = d.bwd_lse + d.n_lse;
    CUDA_CHECK(cudaMalloc(&d.grads, d.n_grads * sizeof(float)));
    size_t C = (size_t)P.NH * P.D;
    for (int i = 0; i < 3; i++) {
        if (token_major) /* straight into dqkv [B, T, 3C], as the backward without RoPE */
            d.g[i] = {d.grads + i * C, 3 * (size_t)P.T * C, (size_t)P.D, 3 * C, P.NH};
        else /* per head [BH, T, D] */
            d.g[i] = {d.grads + i * d.n_out, (size_t)P.NH * P.T * P.D, (size_t)P.T * P.D,
                      (size_t)P.D, P.NH};
    }
}
static void dev_upload(dev_problem &d, const std::vector<uint16_t> *in) {
    uint16_t *dst[4] = {d.q, d.k, d.v, d.dout};
    for (int i = 0; i < 4; i++)
        CUDA_CHECK(cudaMemcpy(dst[i], in[i].data(), d.n_in * 2, cudaMemcpyHostToDevice));
}
static void dev_free(dev_problem &d) {
    CUDA_CHECK(cudaFree(d.q));
    CUDA_CHECK(cudaFree(d.out));
    CUDA_CHECK(cudaFree(d.lse));
    CUDA_CHECK(cudaFree(d.grads));
}

/* what one version produced: out, lse, dq|dk|dv, each with its guards */
struct results {
    std::vector<float> out, lse, grads;
};
static void run_version(results &r, int ver, dev_problem &d) {
    const problem &P = d.P;
    /* SENTINEL everywhere, guards included */
    CUDA_CHECK(cudaMemset(d.out, 0xFF, (d.n_out + GUARD_FLOATS) * sizeof(float)));
    CUDA_CHECK(cudaMemset(d.lse, 0xFF, (d.n_lse + GUARD_FLOATS) * sizeof(float)));
    run_fwd(ver, P, d.out, d.lse, d.q, d.k, d.v);
    if (ver == 1) { /* the backward's inputs, the same for every version */
        CUDA_CHECK(cudaMemcpy(d.bwd_lse, d.lse, d.n_lse * 4, cudaMemcpyDeviceToDevice));
        rowdot_kernel<<<cdiv_u(d.n_lse, 256), 256>>>(d.Dv, d.dout, d.out, P.BH, P.T, P.Tp, P.NH,
                                                     P.D);
        CUDA_CHECK(cudaGetLastError());
    }
    CUDA_CHECK(cudaMemset(d.grads, 0xFF, d.n_grads * sizeof(float)));
    run_bwd(ver, 3, P, d.g, d.q, d.k, d.v, d.dout, d.bwd_lse, d.Dv);
    CUDA_CHECK(cudaDeviceSynchronize());
    r.out.resize(d.n_out + GUARD_FLOATS), r.lse.resize(d.n_lse + GUARD_FLOATS);
    r.grads.resize(d.n_grads);
    CUDA_CHECK(cudaMemcpy(r.out.data(), d.out, r.out.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(r.lse.data(), d.lse, r.lse.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(r.grads.data(), d.grads, d.n_grads * 4, cudaMemcpyDeviceToHost));
}

/* Every check of one version's results on heads [bh0, BH) against the CPU reference refs
 * (refs[bh - bh0]), against version 1's results r1 bit for bit (ver > 1), and the guards. */
static void check_version(int ver, const dev_problem &d, const results &r, const results &r1,
                          const std::vector<ref_head> &refs, int bh0, const char *shape) {
    const problem &P = d.P;
    const int T = P.T, D = P.D, nh = P.BH - bh0;
    const size_t C = (size_t)P.NH * D, per = (size_t)T * D;
    std::vector<float> got((size_t)nh * per), gl((size_t)nh * T);
    std::vector<double> ref((size_t)nh * per), rl((size_t)nh * T);
    /* out [B, T, C] and lse [BH, T] of the checked heads, in [head][t][d] order */
    for (int i = 0; i < nh; i++) {
        int bh = bh0 + i, b = bh / P.NH, h = bh % P.NH;
        for (int t = 0; t < T; t++) {
            for (int e = 0; e < D; e++) {
                got[i * per + (size_t)t * D + e] =
                    r.out[((size_t)b * T + t) * C + (size_t)h * D + e];
                ref[i * per + (size_t)t * D + e] = refs[i].out[(size_t)t * D + e];
            }
            gl[(size_t)i * T + t] = r.lse[(size_t)bh * T + t];
            rl[(size_t)i * T + t] = refs[i].lse[t];
        }
    }
    strcpy(group_errs, " errors vs CPU:");
    check_close(ver, "forward out vs CPU", "out", shape, got.data(), ref.data(), got.size(), 1e-2,
                0);
    check_close(ver, "forward lse vs CPU", "lse", shape, gl.data(), rl.data(), gl.size(), 1e-4,
                1);
    static const char *const names[3] = {"backward dq vs CPU", "backward dk vs CPU",
                                         "backward dv vs CPU"};
    static const char *const labels[3] = {"dq", "dk", "dv"};
    for (int gi = 0; gi < 3; gi++) {
        const layout &L = d.g[gi];
        size_t off0 = (size_t)(L.p - d.grads);
        for (int i = 0; i < nh; i++) {
            int bh = bh0 + i;
            const std::vector<double> &rg = gi == 0   ? refs[i].dq
                                            : gi == 1 ? refs[i].dk
                                                      : refs[i].dv;
            for (int t = 0; t < T; t++) {
                size_t at = off0 + (size_t)(bh / L.NH) * L.sB + (size_t)(bh % L.NH) * L.sH +
                            (size_t)t * L.sT;
                for (int e = 0; e < D; e++) {
                    got[i * per + (size_t)t * D + e] = r.grads[at + e];
                    ref[i * per + (size_t)t * D + e] = rg[(size_t)t * D + e];
                }
            }
        }
        check_close(ver, names[gi], labels[gi], shape, got.data(), ref.data(), got.size(), 2e-2,
                    0);
    }
    size_t guard_bad = 0;
    const std::vector<float> *bufs[3] = {&r.out, &r.lse, &r.grads};
    for (const std::vector<float> *b : bufs)
        for (size_t i = b->size() - GUARD_FLOATS; i < b->size(); i++) {
            uint32_t u;
            memcpy(&u, &(*b)[i], 4);
            guard_bad += u != SENTINEL;
        }
    report(ver, !guard_bad, "no write past out, lse, dq/dk/dv", shape,
           guard_bad ? "guard floats changed" : "");
    if (ver > 1 && BIT_IDENTICAL[ver]) {
        strcat(group_errs, "; bits vs v1:");
        check_bits(ver, "forward out == v1", "out", shape, r.out.data(), r1.out.data(),
                   r.out.size() * 4);
        check_bits(ver, "forward lse == v1", "lse", shape, r.lse.data(), r1.lse.data(),
                   r.lse.size() * 4);
        check_bits(ver, "backward dq|dk|dv|guard == v1", "grads", shape, r.grads.data(),
                   r1.grads.data(), r.grads.size() * 4);
    } else if (ver > 1) { /* every value, guards aside (checked above) */
        strcat(group_errs, "; vs v1:");
        std::vector<double> v1d(r1.out.begin(), r1.out.end() - GUARD_FLOATS);
        check_close(ver, "forward out vs v1", "out", shape, r.out.data(), v1d.data(), v1d.size(),
                    2e-3, 0);
        v1d.assign(r1.lse.begin(), r1.lse.end() - GUARD_FLOATS);
        check_close(ver, "forward lse vs v1", "lse", shape, r.lse.data(), v1d.data(), v1d.size(),
                    1e-4, 1);
        v1d.assign(r1.grads.begin(), r1.grads.end() - GUARD_FLOATS);
        check_close(ver, "backward dq|dk|dv vs v1", "grads", shape, r.grads.data(), v1d.data(),
                    v1d.size(), 5e-3, 0);
    }
    summarize(ver, shape);
}

/* one small problem: every version against the CPU reference on every head, and against v1 */
static void check_case(int B, int NH, int T, int D, int token_major) {
    problem P = make_problem(B, NH, T, D);
    std::vector<uint16_t> in[4];
    for (int i = 0; i < 4; i++) fill_bf16(in[i], P, i == 0);
    dev_problem d;
    dev_alloc(d, P, token_major);
    dev_upload(d, in);
    std::vector<ref_head> refs(P.BH);
    for (int bh = 0; bh < P.BH; bh++) ref_attention(refs[bh], P, bh, in[0], in[1], in[2], in[3]);
    char shape[96];
    snprintf(shape, sizeof(shape), "B%d NH%d T%d HS%d, %s", B, NH, T, D,
             token_major ? "into dqkv" : "per head");
    results r1, r;
    run_version(r1, 1, d);
    check_version(1, d, r1, r1, refs, 0, shape);
    for (int ver = 2; ver <= N_VERSIONS; ver++) {
        run_version(r, ver, d);
        check_version(ver, d, r, r1, refs, 0, shape);
    }
    dev_free(d);
}

/* ---- timing ---- */
template <class F> static float time_ms(int iters, F launch) {
    launch(); /* warm-up (and the shared-memory setup) */
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0));
    for (int it = 0; it < iters; it++) launch();
    CUDA_CHECK(cudaEventRecord(e1));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    return ms / iters;
}

/* A timing shape: each version bit for bit against version 1 and, on the last head, against
 * the CPU reference; then every version whose checks all passed so far is timed. */
static void bench_case(const char *name, int B, int NH, int T, int D, int iters, int check_only) {
    problem P = make_problem(B, NH, T, D);
    char shape[128];
    snprintf(shape, sizeof(shape), "%s B%d NH%d T%d HS%d", name, B, NH, T, D);
    printf("\n== %s\n", shape);
    std::vector<uint16_t> in[4];
    for (int i = 0; i < 4; i++) fill_bf16(in[i], P, i == 0);
    dev_problem d;
    dev_alloc(d, P, 1);
    dev_upload(d, in);
    std::vector<ref_head> refs(1);
    ref_attention(refs[0], P, P.BH - 1, in[0], in[1], in[2], in[3]);
    results r1, r;
    run_version(r1, 1, d);
    check_version(1, d, r1, r1, refs, P.BH - 1, shape);
    for (int ver = 2; ver <= N_VERSIONS; ver++) {
        run_version(r, ver, d);
        check_version(ver, d, r, r1, refs, P.BH - 1, shape);
    }
    r1 = results(), r = results();
    if (check_only) {
        dev_free(d);
        return;
    }
    const double fwd_flop = 4.0 * B * NH * (double)T * T * D / 2, product = fwd_flop / 2;
    float ms[N_VERSIONS + 1][3] = {};
    for (int ver = 1; ver <= N_VERSIONS; ver++) {
        if (version_failed[ver]) continue;
        ms[ver][0] = time_ms(iters, [&] { run_fwd(ver, P, d.out, d.lse, d.q, d.k, d.v); });
        ms[ver][1] = time_ms(
            iters, [&] { run_bwd(ver, 1, P, d.g, d.q, d.k, d.v, d.dout, d.bwd_lse, d.Dv); });
        ms[ver][2] = time_ms(
            iters, [&] { run_bwd(ver, 2, P, d.g, d.q, d.k, d.v, d.dout, d.bwd_lse, d.Dv); });
    }
    /* one row per version: ms and TFLOP/s per kernel, then the speedups over version 1 */
    const double flop[4] = {fwd_flop, 4 * product, 3 * product, 5 * product};
    printf("  %-3s  %-22s  %-22s  %-22s  %-22s  %s\n", "", "forward", "bwd dk/dv (4 products)",
           "bwd dq (3 products)", "bwd total (5 products)", "vs v1: fwd, bwd");
    for (int ver = 1; ver <= N_VERSIONS; ver++) {
        printf("  v%-2d", ver);
        if (!ms[ver][0]) {
            printf("  not timed: its checks failed\n");
            continue;
        }
        const float t[4] = {ms[ver][0], ms[ver][1], ms[ver][2], ms[ver][1] + ms[ver][2]};
        for (int kk = 0; kk < 4; kk++)
            printf("  %7.3f ms %6.1f TF/s", t[kk], flop[kk] / (t[kk] * 1e-3) / 1e12);
        if (ver > 1 && ms[1][0] > 0)
            printf("  x%.2f, x%.2f", ms[1][0] / t[0], (ms[1][1] + ms[1][2]) / t[3]);
        printf("\n");
    }
    dev_free(d);
}

int main(int argc, char **argv) {
    int iters = 10, check_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "check"))
            check_only = 1;
        else if (!strcmp(argv[i], "-v"))
            verbose = 1;
        else if ((iters = atoi(argv[i])) < 1) {
            fprintf(stderr, "usage: %s [iters >= 1] [check] [-v]\n", argv[0]);
            return 2;
        }
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    for (int ver = 1; ver <= N_VERSIONS; ver++) printf("v%d: %s\n", ver, VERSION_NOTE[ver]);

    static const int Ts[] = {1, 63, 64, 65, 150, 200, 257};
    static const int Ds[] = {32, 64, 128};
    int idx = 0;
    for (int D : Ds)
        for (int T : Ts) check_case(2, 3, T, D, idx++ & 1);

    bench_case("GPT-2 124M", 32, 12, 1024, 64, iters, check_only);
    bench_case("GPT-2 1.5B", 16, 25, 1024, 64, iters, check_only);
    bench_case("HS 128", 8, 16, 2048, 128, iters, check_only);

    printf("\n");
    for (int ver = 1; ver <= N_VERSIONS; ver++)
        printf("v%d: %s\n", ver,
               version_failed[ver] ? "SOME CHECKS FAILED" : "all checks passed");
    printf("checks: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
