/* CUDA backend — attention core: BF16 tensor-core flash attention (--cuda-attn flash).
 *
 * Inputs come straight from the op's qkv [B, T, (NH + 2 NKV) HS] (FP32); head sizes 32, 64 and
 * 128. Grouped-query attention: the conversion kernel copies each K/V head to the query heads
 * of its group, so every kernel below sees NH full heads.
 * Numerics (the contract in cuda_common.cuh):
 *   - q, k, v are rounded to BF16 (round-to-nearest-even), RoPE applied first in FP32 when
 *     asked (the prep kernel's arithmetic), by one conversion kernel that writes padded copies
 *     [B*NH, Tp, HS], Tp = T rounded up to 64, rows >= T zero, into scratch slot SCR_ATTN2
 *     (dout likewise from its token-major layout, by a pass that also takes the backward's
 *     Dv = rowsum(dout * out)); the tile loads then need no bounds checks.
 *     When the caller gives a saved buffer (the model's per-layer attention state), the
 *     forward writes q, k, v there and the backward reads them instead of converting qkv
 *     again (at GPT-2 124M, 32x1024: the backward went from 14.0 to 10.0 ms per step with
 *     this and the version-3 kernels together).
 *   - dq, dk, dv are written through a row layout (fl_out): straight into dqkv [B, T, 3C]
 *     when there is no RoPE to undo and no GQA group to sum, else per head for the caller's
 *     post kernel.
 *   - S = q k^T on tensor cores (mma.sync m16n8k16 BF16 x BF16 -> FP32 accumulate); online
 *     softmax in FP32; P rounded to BF16 for P V; O accumulated in FP32; lse in FP32.
 *     Exponentials (all but the head-size-128 forward's) are base 2 through one ex2.approx.ftz
 *     instruction (ex2_ftz): probabilities below 2^-126 flush to zero where exp2f would keep
 *     them as subnormals (an absolute change below 2^-126 per probability; a row's largest p
 *     is 1). Forward, head sizes 32/64: the row max is taken on the raw scores and scaled once,
 *     and p = 2^(S * scale * log2e - m) is one FFMA on the raw score (the scale folded into
 *     the exponent's multiply-add). Forward, head size 128: the previous kernel
 *     (flash_fwd_v1_kernel: exp2f of S * scale * log2e minus a base-2 max), faster there.
 *   - backward: P = exp2(S * scale * log2e - lse * log2e) recomputed in FP32 from the BF16 q, k;
 *     dP = dout v^T; dS = P (dP - Dv) in FP32, rounded to BF16 for the products; dv = P^T dout,
 *     dk = dS^T q * scale, dq = dS k * scale, FP32 accumulation and results.
 *   - not bit-identical to the previous kernels (dev/cuda/flash_ladder.cu version 1): the
 *     exponent arguments differ by one FP32 rounding and subnormal p flush to zero (the new
 *     tiling alone, the ladder's version 2, gave identical bits: every output element sums its
 *     k-steps in the same order). The ladder's version 3 is these kernels (its version 1 the
 *     head-size-128 forward); it checks them against a CPU double-precision reference on the
 *     same BF16 inputs: max |x - ref| / max |ref| <= 1e-2 (out), 2e-2 (dq, dk, dv),
 *     |lse - ref| <= 1e-4, and against version 1 within 2e-3 (out), 5e-3 (dq, dk, dv, of the
 *     max), 1e-4 (lse); all passed on the H200.
 *   - deterministic, no atomics: one kernel for dk, dv per key block (looping over query tiles)
 *     and one for dq per query block (looping over key tiles); both recompute P.
 *   - causal: key tiles above a warp's diagonal are never computed; within the backward's
 *     32-wide steps, a step whose entries are all masked is skipped (it would add exact zeros).
 *
 * Tiles (head sizes 32/64 forward, all backward kernels): 128 threads = 4 warps; each warp
 * holds MT m16 tiles (MT = 2 for head sizes <= 64: 32 query rows per warp in the forward and
 * dq, 32 keys per warp in dk/dv, 128-row blocks; MT = 1 for head size 128, whose two-tile
 * accumulators would not fit in 255 registers), so every B fragment read from shared memory
 * feeds MT mma. Key (query) tiles are 64 wide and stream through shared memory with cp.async
 * double buffering; a warp whose rows end before a tile skips it, and only its diagonal tile is
 * masked (a separate instantiation of the tile body). Every fragment is loaded with ldmatrix
 * (.x4 for A operands and B operands stored [n][k], .x4.trans for B stored [k][n]); for head
 * sizes <= 64 the Q (and dO) A fragments stay in registers for the whole block. The backward
 * works in 32-wide steps (query steps in dk/dv; key steps in dq when MT = 2) so a step's FP32
 * scores stay in registers without spills; dk/dv loads the next query tile's lse and Dv into
 * registers during the current tile. Shared-memory rows are padded to HS + 8 BF16 (a 16-byte
 * multiple) so the ldmatrix rows of a warp hit distinct banks.
 * Grids: (B*NH, row blocks), the longest rows (or most query tiles) first; row blocks =
 * ceil(Tp / (64 MT)) (the head-size-128 forward: Tp / 64).
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
 * memory. */
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"

/* ==== device primitives ==== */

/* c += a * b, one m16n8k16 BF16 tensor-core product with FP32 accumulation (layout above) */
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

/* 32-bit load of two adjacent BF16 (4-byte aligned) */
__device__ __forceinline__ uint32_t ld32(const uint16_t *p) {
    return *reinterpret_cast<const uint32_t *>(p);
}

/* ==== kernels ==== */

#define FL_TILE 64     /* query rows and keys per tile */
#define FL_THREADS 128 /* 4 warps (16 MT rows each; 16 in flash_fwd_v1_kernel) */
#define FL_LOG2E 1.4426950408889634f
#define FL_LN2 0.6931471805599453f

/* dst [BH, Tp, D] BF16 from the FP32 dout [B, T, NH * D] (rows t >= T zero), and
 * Dv[bh, t] = sum over d of dout * out (out: the forward's [B, T, NH * D]; t < T) from the same
 * pass: D/8 consecutive lanes share a row, each taking 8 head dims (two float4 loads of dout and
 * of out, or scalar ones when vec is 0; one 16-byte store); their partial sums are added by xor
 * shuffles 1, 2, 4 (, 8): a fixed order, so Dv is deterministic. A warp walks 32 consecutive
 * (row, 8-dim) items per step, so every lane of it reaches the shuffles. */
__global__ void flash_dout_kernel(uint16_t *dst, float *Dv, const float *__restrict__ dout,
                                  const float *__restrict__ out, int BH, int T, int Tp, int NH,
                                  int D, int vec) {
    const int D8 = D / 8, lane = threadIdx.x & 31;
    const size_t n = (size_t)BH * Tp * D8, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t base = (size_t)blockIdx.x * blockDim.x + (threadIdx.x & ~31u); base < n;
         base += stride) {
        const size_t i = base + lane;
        const int active = i < n;
        int c = (int)(i % D8);
        size_t row = i / D8; /* bh * Tp + t */
        int t = (int)(row % Tp), bh = (int)(row / Tp);
        float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, s = 0.0f;
        if (active && t < T) {
            const size_t off =
                ((size_t)(bh / NH) * T + t) * NH * D + (size_t)(bh % NH) * D + 8 * c;
            const float *p = dout + off, *q = out + off;
            float y[8];
            if (vec) {
                float4 u = *reinterpret_cast<const float4 *>(p);
                float4 w = *reinterpret_cast<const float4 *>(p + 4);
                float4 a = *reinterpret_cast<const float4 *>(q);
                float4 b = *reinterpret_cast<const float4 *>(q + 4);
                x[0] = u.x, x[1] = u.y, x[2] = u.z, x[3] = u.w;
                x[4] = w.x, x[5] = w.y, x[6] = w.z, x[7] = w.w;
                y[0] = a.x, y[1] = a.y, y[2] = a.z, y[3] = a.w;
                y[4] = b.x, y[5] = b.y, y[6] = b.z, y[7] = b.w;
            } else {
                for (int e = 0; e < 8; e++) x[e] = p[e], y[e] = q[e];
            }
            for (int e = 0; e < 8; e++) s += x[e] * y[e];
        }
        for (int o = 1; o < D8; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (!active) continue;
        if (c == 0 && t < T) Dv[(size_t)bh * T + t] = s;
        uint4 o4;
        o4.x = pack_bf16x2(x[0], x[1]);
        o4.y = pack_bf16x2(x[2], x[3]);
        o4.z = pack_bf16x2(x[4], x[5]);
        o4.w = pack_bf16x2(x[6], x[7]);
        *reinterpret_cast<uint4 *>(dst + row * D + 8 * c) = o4;
    }
}

/* q, k, v [BH, Tp, HS] BF16 from qkv [B, T, (NH + 2 NKV) HS] FP32 (q [NH, HS] | k [NKV, HS] |
 * v [NKV, HS] per token, C = NH * HS): query head h's k and v are those of K/V head
 * h / (NH / NKV) (grouped-query attention: each query head gets its own copy); when cosv is
 * non-NULL q and k are first rotated in FP32 (rotate-half pairs
 * (i, i + HS/2), the arithmetic of attn_prep_kernel); rows t >= T are zero. bias (or NULL):
 * added to every token's row first (bias_add's one FP32 add: fp8t_attn_shape's qkv_bias).
 * One thread per (head row, 8 dims i..i+7 of the first half): it also does the partners
 * i + HS/2.., so every load and store is 16 bytes (vec: qkv and bias 16-byte aligned) or
 * scalar loads. */
__global__ void flash_qkv_to_bf16_kernel(uint16_t *qh, uint16_t *kh, uint16_t *vh,
                                         const float *__restrict__ qkv,
                                         const float *__restrict__ bias,
                                         const float *__restrict__ cosv,
                                         const float *__restrict__ sinv, int BH, int T, int Tp,
                                         int NH, int NKV, int HS, int vec) {
    const int half = HS / 2, H8 = half / 8;
    const size_t C = (size_t)NH * HS, CKV = (size_t)NKV * HS, W = C + 2 * CKV;
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
            const float *tok = qkv + ((size_t)(bh / NH) * T + t) * W;
            const size_t kvh = (size_t)((bh % NH) / (NH / NKV));
            /* where q, k and v of this head start in the token's row */
            const size_t col3[3] = {(size_t)(bh % NH) * HS, C + kvh * HS, C + CKV + kvh * HS};
            /* o[0..7] = p[0..7]: two 16-byte loads (vec) or scalar ones */
            auto load8 = [vec](float *o, const float *p) {
                if (vec) {
                    float4 u = *reinterpret_cast<const float4 *>(p);
                    float4 w = *reinterpret_cast<const float4 *>(p + 4);
                    o[0] = u.x, o[1] = u.y, o[2] = u.z, o[3] = u.w;
                    o[4] = w.x, o[5] = w.y, o[6] = w.z, o[7] = w.w;
                } else {
                    for (int e = 0; e < 8; e++) o[e] = p[e];
                }
            };
            for (int a = 0; a < 6; a++) {
                const size_t c0 = col3[a / 2] + (a & 1 ? d1 : d0);
                load8(x[a], tok + c0);
                if (bias) {
                    float bb[8];
                    load8(bb, bias + c0);
                    for (int e = 0; e < 8; e++) add_into(x[a][e], bb[e]);
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

/* ==== forward (head sizes 32, 64) and backward (all head sizes) kernels ==== */

/* the m16 tiles per warp: two where the accumulators fit in registers */
template <int D> constexpr int default_mt(void) { return D <= 64 ? 2 : 1; }

/* Rows [0, R) of a BF16 [.., D] row-major matrix at g (row stride D) into shared s[R][D + 8]
 * with cp.async; every thread of the block takes part. Thread tid copies the 16-byte chunk
 * tid % CPR of rows tid / CPR + i * (FL_THREADS / CPR): the addresses are one base per thread
 * plus compile-time offsets (cp_tile below divides the chunk index for every copy, ~14 integer
 * instructions per cp.async). */
template <int D, int R>
__device__ __forceinline__ void cp_rows(uint16_t *s, const uint16_t *g, int tid) {
    /* chunks per row, rows per pass */
    constexpr int LDT = D + 8, CPR = D / 8, RPP = FL_THREADS / CPR;
    static_assert(FL_THREADS % CPR == 0 && R % RPP == 0, "every thread copies R / RPP chunks");
    const unsigned r = (unsigned)tid / CPR, cc = (unsigned)tid % CPR;
    uint16_t *sp = s + r * LDT + 8 * cc;
    const uint16_t *gp = g + r * D + 8 * cc;
#pragma unroll
    for (int i = 0; i < R / RPP; i++) cp_async16(sp + i * RPP * LDT, gp + i * RPP * D);
}
/* n rows, n = R or 64 (a block's last tile when Tp / 64 is odd) */
template <int D, int R>
__device__ __forceinline__ void cp_block_rows(uint16_t *s, const uint16_t *g, int n, int tid) {
    if (R == FL_TILE || n == R)
        cp_rows<D, R>(s, g, tid);
    else
        cp_rows<D, FL_TILE>(s, g, tid);
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
 * accumulated in order kk = 0, 1, .. */
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
 * tile's 64-row frame; kbase = the tile's first key). Online softmax in base 2 on the raw scores
 * S: the row max is taken on S and scaled once (max(round(c s)) = round(c max(s)): rounding is
 * monotonic), and p = 2^(S * scale * log2e - m) is one FFMA on the raw score plus ex2_ftz.
 * DIAG: the warp's diagonal tile, where keys after the row (and keys >= T) are masked (-inf,
 * so p = 0); every other tile is unmasked. */
template <int D, int MT, bool DIAG>
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
        float r0 = -INFINITY, r1 = -INFINITY; /* max of the raw scores, scaled once */
#pragma unroll
        for (int j = 0; j < 8; j++) {
            r0 = fmaxf(r0, fmaxf(s[m][j][0], s[m][j][1]));
            r1 = fmaxf(r1, fmaxf(s[m][j][2], s[m][j][3]));
        }
        float mx0 = fmaxf(mrow[m][0], quad_max(r0) * scale_log2);
        float mx1 = fmaxf(mrow[m][1], quad_max(r1) * scale_log2);
        /* a row with nothing unmasked yet keeps m = -inf; subtract 0 then (no -inf - -inf) */
        float mu0 = mx0 == -INFINITY ? 0.f : mx0, mu1 = mx1 == -INFINITY ? 0.f : mx1;
        float alpha0 = ex2_ftz(mrow[m][0] - mu0), alpha1 = ex2_ftz(mrow[m][1] - mu1);
        mrow[m][0] = mx0, mrow[m][1] = mx1;
        float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            s[m][j][0] = ex2_ftz(__fmaf_rn(s[m][j][0], scale_log2, -mu0));
            s[m][j][1] = ex2_ftz(__fmaf_rn(s[m][j][1], scale_log2, -mu0));
            s[m][j][2] = ex2_ftz(__fmaf_rn(s[m][j][2], scale_log2, -mu1));
            s[m][j][3] = ex2_ftz(__fmaf_rn(s[m][j][3], scale_log2, -mu1));
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

/* Forward (head sizes 32, 64). Grid (BH, ceil(Tp / ROWS)), block 128; query block qb = last -
 * blockIdx.y (the longest rows first). Warp w owns query rows qb * ROWS + 16 MT w + [0, 16 MT)
 * (none if that is >= Tp: the block's last 64 rows when Tp / 64 is odd). Shared: Q [ROWS][LDT] (for
 * head sizes <= 64 only read once into registers), K, V [2][64][LDT]. */
template <int D, int MT = default_mt<D>()>
__global__ void __launch_bounds__(FL_THREADS)
    flash_fwd_kernel(float *out, float *lse, const uint16_t *__restrict__ q,
                     const uint16_t *__restrict__ k, const uint16_t *__restrict__ v, int T,
                     int Tp, int NH, float scale_log2) {
    constexpr int BM = 4 * 16 * MT, LDT = D + 8, TILE = FL_TILE * LDT;
    extern __shared__ uint4 flash_smem[];
    uint16_t *Qs = reinterpret_cast<uint16_t *>(flash_smem); /* [BM][LDT] */
    uint16_t *Ks = Qs + BM * LDT;                            /* [2][64][LDT] */
    uint16_t *Vs = Ks + 2 * TILE;                            /* [2][64][LDT] */
    const int nQ = (Tp + BM - 1) / BM;
    const int bh = blockIdx.x, qb = nQ - 1 - (int)blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t base = (size_t)bh * Tp * D;
    const uint16_t *kb = k + base, *vb = v + base;
    const int q0 = qb * BM, nrows = min(BM, Tp - q0);
    const int ntiles = (q0 + nrows) / FL_TILE; /* key tiles 0 .. ntiles - 1 */
    const int wrow = q0 + 16 * MT * warp;      /* the warp's first query row */
    const bool active = wrow < Tp;
    /* its diagonal key tile, and its first row within that tile */
    const int wtile = wrow / FL_TILE, lrow = wrow % FL_TILE;
    const uint16_t *Qw = Qs + 16 * MT * warp * LDT;

    cp_block_rows<D, BM>(Qs, q + base + (size_t)q0 * D, nrows, tid);
    cp_async_commit();
    cp_rows<D, FL_TILE>(Ks, kb, tid);
    cp_rows<D, FL_TILE>(Vs, vb, tid);
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
            cp_rows<D, FL_TILE>(Ks + (st ^ 1) * TILE, kb + (size_t)(kt + 1) * FL_TILE * D, tid);
            cp_rows<D, FL_TILE>(Vs + (st ^ 1) * TILE, vb + (size_t)(kt + 1) * FL_TILE * D, tid);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint16_t *Kc = Ks + st * TILE, *Vc = Vs + st * TILE;
        if (active && kt < wtile)
            fwd_tile<D, MT, false>(o, mrow, lsum, qf, Qw, Kc, Vc, lane, lrow, kt * FL_TILE, T,
                                   scale_log2);
        else if (active && kt == wtile)
            fwd_tile<D, MT, true>(o, mrow, lsum, qf, Qw, Kc, Vc, lane, lrow, kt * FL_TILE, T,
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
            if (t == 0) lse[(size_t)bh * T + row0] = (mrow[m][0] + log2f(l0)) * FL_LN2;
        }
        if (row1 < T) {
            float inv = 1.f / l1;
            float *orow = out + ((size_t)b * T + row1) * C + (size_t)h * D + 2 * t;
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *reinterpret_cast<float2 *>(orow + 8 * n) =
                    make_float2(o[m][n][2] * inv, o[m][n][3] * inv);
            if (t == 0) lse[(size_t)bh * T + row1] = (mrow[m][1] + log2f(l1)) * FL_LN2;
        }
    }
}

/* One key tile of dq, in steps of SW keys: S = Q K^T, dP = dO V^T (warp: 16 MT rows x SW keys),
 * P = exp2(S * scale * log2e - lse * log2e), dS = P (dP - Dv), dq += dS K. DIAG: the warp's
 * diagonal tile (mask keys after the row and keys >= T; a step all of whose keys are masked is
 * skipped: it would add exact zeros). */
template <int D, int MT, int SW, bool DIAG>
__device__ __forceinline__ void
dq_tile(float (&acc)[MT][D / 8][4], const uint32_t (&qf)[MT][D / 16][4],
        const uint32_t (&df)[MT][D / 16][4], const uint16_t *Qw, const uint16_t *dOw,
        const uint16_t *Kc, const uint16_t *Vc, const float (&L)[MT][2], const float (&Dr)[MT][2],
        int lane, int lrow, int kbase, int T, float scale_log2) {
    constexpr int LDT = D + 8, NJ = SW / 8;
    constexpr bool A_REGS = D <= 64;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll 1 /* one step's scores live at a time (unrolled, ptxas overlaps the steps) */
    for (int h = 0; h < FL_TILE / SW; h++) {
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
                    float p = ex2_ftz(s[m][j][e] * scale_log2 - L[m][e >> 1]);
                    if (DIAG && (key > row || kbase + key >= T)) p = 0.f;
                    s[m][j][e] = p * (dp[m][j][e] - Dr[m][e >> 1]); /* dS */
                }
        pv_acc<D, MT, SW / 16>(acc, s, Kc + SW * h * LDT, lane);
    }
}

/* dq per query block. Grid (BH, ceil(Tp / ROWS)), qb = last - blockIdx.y; loops
 * over key tiles up to the block's last diagonal. Shared: Q, dO [ROWS][LDT] (for head sizes <= 64
 * read once into registers), K, V [2][64][LDT]. Keys in steps of 32 when a warp holds two m16 tiles
 * (registers), else 64. */
template <int D, int MT = default_mt<D>()>
__global__ void __launch_bounds__(FL_THREADS)
    flash_bwd_dq_kernel(fl_out dq, const uint16_t *__restrict__ q, const uint16_t *__restrict__ k,
                        const uint16_t *__restrict__ v, const uint16_t *__restrict__ dout,
                        const float *__restrict__ lse, const float *__restrict__ Dv, int T,
                        int Tp, float scale, float scale_log2) {
    constexpr int BM = 4 * 16 * MT, LDT = D + 8, TILE = FL_TILE * LDT;
    constexpr int SW = MT == 2 ? 32 : 64;
    extern __shared__ uint4 flash_smem[];
    uint16_t *Qs = reinterpret_cast<uint16_t *>(flash_smem); /* [BM][LDT] */
    uint16_t *dOs = Qs + BM * LDT;                           /* [BM][LDT] */
    uint16_t *Ks = dOs + BM * LDT;                           /* [2][64][LDT] */
    uint16_t *Vs = Ks + 2 * TILE;                            /* [2][64][LDT] */
    const int nQ = (Tp + BM - 1) / BM;
    const int bh = blockIdx.x, qb = nQ - 1 - (int)blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t base = (size_t)bh * Tp * D;
    const uint16_t *kb = k + base, *vb = v + base;
    const int q0 = qb * BM, nrows = min(BM, Tp - q0);
    const int ntiles = (q0 + nrows) / FL_TILE;
    const int wrow = q0 + 16 * MT * warp;
    const bool active = wrow < Tp;
    const int wtile = wrow / FL_TILE, lrow = wrow % FL_TILE;
    const uint16_t *Qw = Qs + 16 * MT * warp * LDT, *dOw = dOs + 16 * MT * warp * LDT;

    cp_block_rows<D, BM>(Qs, q + base + (size_t)q0 * D, nrows, tid);
    cp_block_rows<D, BM>(dOs, dout + base + (size_t)q0 * D, nrows, tid);
    cp_async_commit();
    cp_rows<D, FL_TILE>(Ks, kb, tid);
    cp_rows<D, FL_TILE>(Vs, vb, tid);
    cp_async_commit();

    float L[MT][2], Dr[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int row = wrow + 16 * m + g + 8 * i;
            L[m][i] = row < T ? lse[(size_t)bh * T + row] * FL_LOG2E : 0.f;
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
            cp_rows<D, FL_TILE>(Ks + (st ^ 1) * TILE, kb + (size_t)(kt + 1) * FL_TILE * D, tid);
            cp_rows<D, FL_TILE>(Vs + (st ^ 1) * TILE, vb + (size_t)(kt + 1) * FL_TILE * D, tid);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint16_t *Kc = Ks + st * TILE, *Vc = Vs + st * TILE;
        if (active && kt < wtile)
            dq_tile<D, MT, SW, false>(acc, qf, df, Qw, dOw, Kc, Vc, L, Dr, lane, lrow,
                                      kt * FL_TILE, T, scale_log2);
        else if (active && kt == wtile)
            dq_tile<D, MT, SW, true>(acc, qf, df, Qw, dOw, Kc, Vc, L, Dr, lane, lrow,
                                     kt * FL_TILE, T, scale_log2);
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
 * dv += P^T dO, dk += dS^T Q. MASK: the warp's diagonal
 * tile or the last tile (queries before the key or >= T get P = 0; a step all of whose queries
 * are masked is skipped). Lc: lse * log2e, Dc: Dv of the tile's 64 queries. */
template <int D, int MT, bool MASK>
__device__ __forceinline__ void
dkdv_tile(float (&adk)[MT][D / 8][4], float (&adv)[MT][D / 8][4], const uint16_t *Kw,
          const uint16_t *Vw, const uint16_t *Qc, const uint16_t *dOc, const float *Lc,
          const float *Dc, int lane, int wkey, int qbase, int T, float scale_log2) {
    constexpr int LDT = D + 8, SW = 32, NJ = SW / 8;
    const int g = lane >> 2, t = lane & 3;
    uint32_t none[MT][D / 16][4]; /* K, V fragments come from shared memory */
#pragma unroll 1 /* one step's scores live at a time (unrolled, ptxas overlaps the steps) */
    for (int h = 0; h < FL_TILE / SW; h++) {
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
                    float p = ex2_ftz(s[m][j][e] * scale_log2 - Lv);
                    if (MASK && (query < key || query >= T)) p = 0.f;
                    s[m][j][e] = p;                        /* P^T */
                    dp[m][j][e] = p * (dp[m][j][e] - Dvv); /* dS^T */
                }
        }
        pv_acc<D, MT, SW / 16>(adv, s, dOc + SW * h * LDT, lane);
        pv_acc<D, MT, SW / 16>(adk, dp, Qc + SW * h * LDT, lane);
    }
}

/* dk, dv per key block. Grid (BH, ceil(Tp / ROWS)), kb = blockIdx.y (the most
 * query tiles first); loops over the query tiles from the block's first diagonal on. Warp w owns
 * keys kb * ROWS + 16 MT w + [0, 16 MT) (none if >= Tp). Shared: K, V [ROWS][LDT] (loaded once), Q,
 * dO [2][64][LDT], lse * log2e and Dv of the query tile [2][64] FP32 (the next tile's loaded into
 * registers while the current one is computed). */
template <int D, int MT = default_mt<D>()>
__global__ void __launch_bounds__(FL_THREADS)
    flash_bwd_dkdv_kernel(fl_out dk, fl_out dv, const uint16_t *__restrict__ q,
                          const uint16_t *__restrict__ k, const uint16_t *__restrict__ v,
                          const uint16_t *__restrict__ dout, const float *__restrict__ lse,
                          const float *__restrict__ Dv, int T, int Tp, float scale,
                          float scale_log2) {
    constexpr int BN = 4 * 16 * MT, LDT = D + 8, TILE = FL_TILE * LDT;
    extern __shared__ uint4 flash_smem[];
    uint16_t *Ks = reinterpret_cast<uint16_t *>(flash_smem); /* [BN][LDT] */
    uint16_t *Vs = Ks + BN * LDT;                            /* [BN][LDT] */
    uint16_t *Qs = Vs + BN * LDT;                            /* [2][64][LDT] */
    uint16_t *dOs = Qs + 2 * TILE;                           /* [2][64][LDT] */
    float *Ls = reinterpret_cast<float *>(dOs + 2 * TILE);   /* [2][64] lse * log2e */
    float *Ds = Ls + 2 * FL_TILE;                            /* [2][64] Dv */
    const int nT = Tp / FL_TILE;
    const int bh = blockIdx.x, kb = (int)blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t base = (size_t)bh * Tp * D;
    const uint16_t *qb = q + base, *dob = dout + base;
    const float *lseb = lse + (size_t)bh * T, *Dvb = Dv + (size_t)bh * T;
    const int k0 = kb * BN, nrows = min(BN, Tp - k0);
    const int qt0 = k0 / FL_TILE;         /* the block's first query tile */
    const int wkey = k0 + 16 * MT * warp; /* the warp's first key */
    const bool active = wkey < Tp;
    const int wtile = wkey / FL_TILE; /* its diagonal query tile */
    const uint16_t *Kw = Ks + 16 * MT * warp * LDT, *Vw = Vs + 16 * MT * warp * LDT;

    cp_block_rows<D, BN>(Ks, k + base + (size_t)k0 * D, nrows, tid);
    cp_block_rows<D, BN>(Vs, v + base + (size_t)k0 * D, nrows, tid);
    cp_rows<D, FL_TILE>(Qs, qb + (size_t)qt0 * FL_TILE * D, tid);
    cp_rows<D, FL_TILE>(dOs, dob + (size_t)qt0 * FL_TILE * D, tid);
    cp_async_commit();
    if (tid < FL_TILE) {
        int row = qt0 * FL_TILE + tid;
        Ls[tid] = row < T ? lseb[row] * FL_LOG2E : 0.f;
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
            cp_rows<D, FL_TILE>(Qs + nx * TILE, qb + (size_t)(qt + 1) * FL_TILE * D, tid);
            cp_rows<D, FL_TILE>(dOs + nx * TILE, dob + (size_t)(qt + 1) * FL_TILE * D, tid);
            cp_async_commit();
            if (tid < FL_TILE) { /* into registers now, into shared memory after this tile */
                int row = (qt + 1) * FL_TILE + tid;
                nextL = row < T ? lseb[row] * FL_LOG2E : 0.f;
                nextD = row < T ? Dvb[row] : 0.f;
            }
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint16_t *Qc = Qs + st * TILE, *dOc = dOs + st * TILE;
        const float *Lc = Ls + st * FL_TILE, *Dc = Ds + st * FL_TILE;
        if (active && qt >= wtile) {
            if (qt == wtile || qt == nT - 1)
                dkdv_tile<D, MT, true>(adk, adv, Kw, Vw, Qc, dOc, Lc, Dc, lane, wkey,
                                       qt * FL_TILE, T, scale_log2);
            else
                dkdv_tile<D, MT, false>(adk, adv, Kw, Vw, Qc, dOc, Lc, Dc, lane, wkey,
                                        qt * FL_TILE, T, scale_log2);
        }
        if (qt + 1 < nT &&
            tid < FL_TILE) { /* stage nx was last read before the previous barrier */
            Ls[nx * FL_TILE + tid] = nextL;
            Ds[nx * FL_TILE + tid] = nextD;
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

/* ==== the head-size-128 forward (flash_fwd_v1_kernel) and its helpers ==== */

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

/* Forward for head size 128 (see fwd_is_v1): the previous shipped forward, unchanged (exp2f
 * exponentials, one m16 tile per warp, 32-bit fragment loads for K). Grid (BH, nT), block 128.
 * Query tile qt = nT - 1 - blockIdx.y (the longest rows are scheduled first). q, k, v: BF16
 * [BH, Tp, D]. Warp w owns query rows qt*64 + 16w + [0, 16); lane (g, t) holds rows
 * r0 = .. + g and r1 = r0 + 8 of every score fragment. Online softmax in base 2:
 * s2 = S * scale * log2(e), running max m (base 2), running per-thread partial row sums l
 * (reduced over the quad at the end; the rescale factors are quad-uniform). */
template <int D>
__global__ void __launch_bounds__(FL_THREADS)
    flash_fwd_v1_kernel(float *out, float *lse, const uint16_t *__restrict__ q,
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

/* ==== host side ==== */

/* The forward for head size 128 is flash_fwd_v1_kernel: on the H200 it measured faster there
 * than flash_fwd_kernel (B=8, NH=16, T=2048: 0.638 vs 0.684 ms; dev/cuda/flash_ladder.cu
 * versions 1 and 3). Head sizes 32, 64 and every backward use the two-tile kernels. */
template <int D> constexpr bool fwd_is_v1(void) { return D == 128; }

/* shared-memory bytes of each kernel (BF16 rows of pitch D + 8; ROWS = 64 MT) */
static size_t fwd_smem(int D, int MT) { return (size_t)(64 * MT + 4 * FL_TILE) * (D + 8) * 2; }
static size_t fwd_v1_smem(int D) { return (size_t)4 * FL_TILE * (D + 8) * 2; }
static size_t dq_smem(int D, int MT) { return (size_t)(2 * 64 * MT + 4 * FL_TILE) * (D + 8) * 2; }
static size_t dkdv_smem(int D, int MT) {
    return (size_t)(2 * 64 * MT + 4 * FL_TILE) * (D + 8) * 2 +
           (size_t)4 * FL_TILE * sizeof(float);
}
/* query blocks (forward, dq) = key blocks (dk/dv): grid.y of the two-tile kernels */
static int row_blocks(int Tp, int MT) { return (Tp + 64 * MT - 1) / (64 * MT); }

/* Raise the dynamic shared-memory limit of the kernels for head size D, once. */
template <int D> static void flash_setup(void) {
    constexpr int MT = default_mt<D>();
    static int done = 0;
    if (done) return;
    if constexpr (fwd_is_v1<D>())
        CUDA_CHECK(cudaFuncSetAttribute(flash_fwd_v1_kernel<D>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)fwd_v1_smem(D)));
    else
        CUDA_CHECK(cudaFuncSetAttribute(flash_fwd_kernel<D, MT>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)fwd_smem(D, MT)));
    CUDA_CHECK(cudaFuncSetAttribute(flash_bwd_dq_kernel<D, MT>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dq_smem(D, MT)));
    CUDA_CHECK(cudaFuncSetAttribute(flash_bwd_dkdv_kernel<D, MT>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dkdv_smem(D, MT)));
    done = 1;
}

int cuda_attn_flash_supported(int B, int T, int NH, int HS) {
    if (HS != 32 && HS != 64 && HS != 128) return 0;
    if (B <= 0 || T <= 0 || NH <= 0) return 0;
    if ((T + FL_TILE - 1) / FL_TILE > 65535) return 0; /* grid.y */
    if ((long long)B * NH > 2147483647LL) return 0;    /* grid.x */
    return 1;
}

/* BF16 copy [BH, Tp, HS] of the token-major FP32 dout [B, T, NH*HS] (rows >= T zero), and
 * Dv = rowsum(dout * out) [BH, T] from the same pass. */
static void dout_to_bf16(cuda_state *s, uint16_t *dst, float *Dv, const float *dout,
                         const float *out, int B, int T, int Tp, int NH, int HS) {
    int vec = ((uintptr_t)dout & 15) == 0 && ((uintptr_t)out & 15) == 0; /* rows: HS floats */
    size_t n = (size_t)B * NH * Tp * (HS / 8);
    size_t want = (n + 255) / 256, cap = (size_t)s->num_sms * 32;
    unsigned blocks = (unsigned)(want < cap ? want : cap);
    flash_dout_kernel<<<blocks, 256, 0, s->stream>>>(dst, Dv, dout, out, B * NH, T, Tp, NH, HS,
                                                     vec);
    CUDA_LAUNCH_CHECK(s);
}

/* q, k, v as padded BF16 [BH, Tp, HS] from qkv (RoPE applied when cosv is non-NULL). */
static void qkv_to_bf16(cuda_state *s, uint16_t *qh, uint16_t *kh, uint16_t *vh, const float *qkv,
                        const float *bias, const float *cosv, const float *sinv, int B, int T,
                        int Tp, int NH, int NKV, int HS) {
    /* every head starts at a multiple of HS >= 32 */
    int vec = ((uintptr_t)qkv & 15) == 0 && ((uintptr_t)bias & 15) == 0;
    size_t n = (size_t)B * NH * Tp * (HS / 16);
    size_t want = (n + 255) / 256, cap = (size_t)s->num_sms * 32;
    unsigned blocks = (unsigned)(want < cap ? want : cap);
    flash_qkv_to_bf16_kernel<<<blocks, 256, 0, s->stream>>>(qh, kh, vh, qkv, bias, cosv, sinv,
                                                            B * NH, T, Tp, NH, NKV, HS, vec);
    CUDA_LAUNCH_CHECK(s);
}

template <int D>
static void fwd_launch(cuda_state *s, float *out, float *lse, const uint16_t *qh,
                       const uint16_t *kh, const uint16_t *vh, int BH, int T, int Tp, int NH,
                       float scale_log2) {
    constexpr int MT = default_mt<D>();
    flash_setup<D>();
    if constexpr (fwd_is_v1<D>()) {
        dim3 grid(BH, Tp / FL_TILE);
        flash_fwd_v1_kernel<D><<<grid, FL_THREADS, fwd_v1_smem(D), s->stream>>>(
            out, lse, qh, kh, vh, T, Tp, NH, scale_log2);
    } else {
        dim3 grid(BH, row_blocks(Tp, MT));
        flash_fwd_kernel<D, MT><<<grid, FL_THREADS, fwd_smem(D, MT), s->stream>>>(
            out, lse, qh, kh, vh, T, Tp, NH, scale_log2);
    }
    CUDA_LAUNCH_CHECK(s);
}

template <int D>
static void bwd_launch(cuda_state *s, fl_out dq, fl_out dk, fl_out dv, const uint16_t *qh,
                       const uint16_t *kh, const uint16_t *vh, const uint16_t *doh,
                       const float *lse, const float *Dv, int BH, int T, int Tp, float scale,
                       float scale_log2) {
    constexpr int MT = default_mt<D>();
    flash_setup<D>();
    dim3 grid(BH, row_blocks(Tp, MT));
    flash_bwd_dkdv_kernel<D, MT><<<grid, FL_THREADS, dkdv_smem(D, MT), s->stream>>>(
        dk, dv, qh, kh, vh, doh, lse, Dv, T, Tp, scale, scale_log2);
    CUDA_LAUNCH_CHECK(s);
    flash_bwd_dq_kernel<D, MT><<<grid, FL_THREADS, dq_smem(D, MT), s->stream>>>(
        dq, qh, kh, vh, doh, lse, Dv, T, Tp, scale, scale_log2);
    CUDA_LAUNCH_CHECK(s);
}

size_t cuda_attn_flash_saved_bytes(int B, int T, int NH, int HS) {
    const size_t Tp = (size_t)(T + FL_TILE - 1) / FL_TILE * FL_TILE;
    return 3 * (size_t)B * NH * Tp * HS * sizeof(uint16_t); /* q, k, v [BH, Tp, HS] */
}

int cuda_attn_flash_fwd(fp8t_backend *b, float *out, float *lse, uint16_t *saved,
                        const float *qkv, const float *bias, const float *cosv, const float *sinv,
                        int B, int T, int NH, int NKV, int HS, float scale) {
    if (!cuda_attn_flash_supported(B, T, NH, HS)) return -1;
    cuda_state *s = cuda_of(b);
    int nT = (T + FL_TILE - 1) / FL_TILE, Tp = nT * FL_TILE, BH = B * NH;
    size_t per = (size_t)BH * Tp * HS; /* BF16 elements of one padded copy */
    /* the BF16 q, k, v: into the caller's saved buffer (the backward reads them there) or
     * into scratch */
    uint16_t *qh =
        saved ? saved : (uint16_t *)cuda_scratch(b, SCR_ATTN2, 3 * per * sizeof(uint16_t));
    uint16_t *kh = qh + per, *vh = kh + per;
    qkv_to_bf16(s, qh, kh, vh, qkv, bias, cosv, sinv, B, T, Tp, NH, NKV, HS);
    float scale_log2 = scale * FL_LOG2E;
    if (HS == 32)
        fwd_launch<32>(s, out, lse, qh, kh, vh, BH, T, Tp, NH, scale_log2);
    else if (HS == 64)
        fwd_launch<64>(s, out, lse, qh, kh, vh, BH, T, Tp, NH, scale_log2);
    else
        fwd_launch<128>(s, out, lse, qh, kh, vh, BH, T, Tp, NH, scale_log2);
    return 0;
}

int cuda_attn_flash_bwd(fp8t_backend *b, float *dqkv, float *dq, float *dk, float *dv,
                        const float *qkv, const uint16_t *saved, const float *cosv,
                        const float *sinv, const float *dout, const float *out, const float *lse,
                        float *Dv, int B, int T, int NH, int NKV, int HS, float scale) {
    if (!cuda_attn_flash_supported(B, T, NH, HS)) return -1;
    if (dqkv && NKV != NH) return -1; /* a group's dk, dv must be summed: the post kernel */
    cuda_state *s = cuda_of(b);
    int nT = (T + FL_TILE - 1) / FL_TILE, Tp = nT * FL_TILE, BH = B * NH;
    size_t per = (size_t)BH * Tp * HS;
    /* q, k, v as the forward rounded them: from saved, or rounded again from qkv (the same
     * conversion kernel, so the same bits) into scratch after dout's copy */
    uint16_t *doh =
        (uint16_t *)cuda_scratch(b, SCR_ATTN2, (saved ? 1 : 4) * per * sizeof(uint16_t));
    const uint16_t *qh = saved, *kh, *vh;
    if (!saved) {
        uint16_t *q = doh + per;
        qkv_to_bf16(s, q, q + per, q + 2 * per, qkv, NULL, cosv, sinv, B, T, Tp, NH, NKV, HS);
        qh = q;
    }
    kh = qh + per, vh = kh + per;
    dout_to_bf16(s, doh, Dv, dout, out, B, T, Tp, NH, HS);
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
    if (HS == 32)
        bwd_launch<32>(s, oq, ok, ov, qh, kh, vh, doh, lse, Dv, BH, T, Tp, scale, scale_log2);
    else if (HS == 64)
        bwd_launch<64>(s, oq, ok, ov, qh, kh, vh, doh, lse, Dv, BH, T, Tp, scale, scale_log2);
    else
        bwd_launch<128>(s, oq, ok, ov, qh, kh, vh, doh, lse, Dv, BH, T, Tp, scale, scale_log2);
    return 0;
}
