/* CUDA backend — the inference ops: the KV cache (kv_cache_write, attention_decode) and the
 * embedding lookup from a BF16 table (embedding_forward_bf16); the CPU references are in
 * cpu_attention_decode.c.
 *
 * Cache layout per layer: kc, vc [B, NKV] blocks (fp8t_kv_head_bytes) of positions [Tmax, HS],
 * K after RoPE: FP32, BF16 bits, or E4M3 codes followed by one FP32 scale_inv per position.
 * RoPE angles are computed in the kernels as t * inv_freq_i in double, rounded once to float
 * cos/sin: the CPU's table values (fp8t_rope_inv_freq, in double), with no table to keep per
 * position. The frequencies travel in the kernels' parameters (HS/2 doubles, HS <= 256).
 *
 * Decode (split kernel, the default): flash-decoding. One block per (split of the positions,
 * K/V head, sequence) handles the G = NH/NKV query heads of its group together, so a group's
 * K and V are read once for all of them. A lane scores 64 bytes of a cached row against every
 * query head of the group (FP8 at HS 64: the whole row, no cross-lane sum), then the block
 * takes each head's softmax over its split and the P·V sums (a warp load reads whole V rows,
 * 8 bytes a lane: 4 rows at once for FP8 at HS 64; summed over each lane's rows, the warp's
 * row groups, then the warps, in that fixed order). At decode's short splits (a prompt of 128)
 * the kernel is bound by its instructions and its memory latency, not its bytes: hence few
 * shuffles, 64-byte spans per lane and several V rows a warp load.
 * One split: the output directly; several: (max, sum, unnormalized out) per split and a
 * combine kernel (the splits in order). The split length depends on B, NKV, Tmax and the SM
 * count only, the grid on Tmax (not on the positions: blocks past a sequence's position exit
 * at once), so one launch shape serves every decode step of a batch (a graph replays it).
 * Shapes the split kernel does not take (HS not 32, 64, 128 or 256, groups too large for its
 * shared memory) go to the generic kernel: one block per (query head, sequence), keys in
 * chunks of DEC_CHUNK with an online softmax. Every sum is in a fixed order: deterministic. */
#include "backend/cuda/cuda_common.cuh"

enum { DEC_THREADS = 128, DEC_CHUNK = 1024, DEC_MAX_HS = 256 };
enum { SPLIT_THREADS = 128, SPLIT_WARPS = SPLIT_THREADS / 32, SPLIT_GC = 4 };
/* the split kernel's blocks an SM must hold (registers capped at 64 a thread): its time at
 * decode's short splits is latency, so occupancy (measured: 8 blocks against 7 at 72
 * registers, +3% FP8 decode at llama-1b batch 256) beats the registers' few spills */
enum { SPLIT_MIN_BLOCKS = 8 };
#define SPLIT_SMEM_FLOATS 12288 /* 48 KiB: the default dynamic shared-memory limit */

struct rope_freqs {
    double f[DEC_MAX_HS / 2]; /* inv_freq of pair i */
    int on;                   /* RoPE applied */
};

/* element i (0 <= i < Tmax*HS) of a cache block at p: its stored value (FP8: the code's
 * value, without the position's scale) */
__device__ __forceinline__ float kv_elem(const char *p, int kv, size_t i) {
    if (kv == FP8T_KV_BF16) return __uint_as_float((uint32_t)((const uint16_t *)p)[i] << 16);
    if (kv == FP8T_KV_FP8) return fp8_dec_dev(((const uint8_t *)p)[i], FP8_E4M3);
    return ((const float *)p)[i];
}
/* the scale_inv of position t of an FP8 block (1 for the other kinds) */
__device__ __forceinline__ float kv_pos_scale(const char *p, int kv, int t, size_t soff) {
    return kv == FP8T_KV_FP8 ? ((const float *)(p + soff))[t] : 1.0f;
}

__device__ __forceinline__ void kv_store(void *c, int bf16, size_t i, float x) {
    if (bf16)
        ((uint16_t *)c)[i] = (uint16_t)(__float_as_uint(bf16_round_dev(x)) >> 16);
    else
        ((float *)c)[i] = x;
}

/* qkv element c of a row (+ bias[c], bias_add's add, where the op was given one) */
__device__ __forceinline__ float qkv_at(const float *__restrict__ row,
                                        const float *__restrict__ bias, size_t c) {
    return bias ? row[c] + bias[c] : row[c];
}

/* Token rows of qkv into an FP32 or BF16 cache. pos == NULL (prefill): row b*T + t goes to
 * position t; else (decode, T = 1) row b goes to position pos[b]. One thread per (row, K/V
 * head, i < half): elements i and i + HS/2 of K (rotated) and V. bias: fp8t_attn_shape's
 * qkv_bias, or NULL. */
__global__ void kv_write_kernel(void *kc, void *vc, int kv_bf16, const float *__restrict__ qkv,
                                const float *__restrict__ bias, const int *__restrict__ pos,
                                int B, int T, int NH, int NKV, int HS, int Tmax, rope_freqs fr) {
    const int half = (HS + 1) / 2, W = (NH + 2 * NKV) * HS;
    const size_t total = (size_t)B * T * NKV * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(idx % half);
        size_t r = idx / half;
        const int g = (int)(r % NKV);
        r /= NKV; /* token row */
        const int bb = (int)(r / T);
        const int t = pos ? pos[bb] : (int)(r % T);
        const size_t ck = (size_t)(NH + g) * HS, cv = ck + (size_t)NKV * HS;
        const float *tok = qkv + r * W;
        const size_t dst = (((size_t)bb * NKV + g) * Tmax + t) * HS;
        const int i2 = i + HS / 2; /* odd HS (never rotated): the middle element twice */
        float k1 = qkv_at(tok, bias, ck + i), k2 = qkv_at(tok, bias, ck + i2);
        if (fr.on) {
            const double ang = (double)t * fr.f[i];
            const float c = (float)cos(ang), s = (float)sin(ang);
            const float r1 = k1 * c - k2 * s, r2 = k2 * c + k1 * s;
            k1 = r1, k2 = r2;
        }
        kv_store(kc, kv_bf16, dst + i, k1);
        kv_store(kc, kv_bf16, dst + i2, k2);
        kv_store(vc, kv_bf16, dst + i, qkv_at(tok, bias, cv + i));
        kv_store(vc, kv_bf16, dst + i2, qkv_at(tok, bias, cv + i2));
    }
}

/* Token rows into an FP8 cache: one warp per (row, K/V head); lane l holds elements l, l + 32,
 * ... of K (rotated; the products rounded one by one, as the CPU's rotation) and then V, whose
 * amax (a warp max) gives the position's scale: the codes and scale_inv of the CPU's put_row. */
__global__ void kv_write_fp8_kernel(void *kc, void *vc, const float *__restrict__ qkv,
                                    const float *__restrict__ bias, const int *__restrict__ pos,
                                    int B, int T, int NH, int NKV, int HS, int Tmax, size_t hb,
                                    size_t soff, rope_freqs fr) {
    const int lane = threadIdx.x & 31, half = HS / 2, W = (NH + 2 * NKV) * HS;
    const size_t warps = (size_t)B * T * NKV;
    for (size_t wi = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; wi < warps;
         wi += ((size_t)gridDim.x * blockDim.x) >> 5) {
        const int g = (int)(wi % NKV);
        const size_t r = wi / NKV; /* token row */
        const int bb = (int)(r / T);
        const int t = pos ? pos[bb] : (int)(r % T);
        const size_t col[2] = {(size_t)(NH + g) * HS, (size_t)(NH + NKV + g) * HS};
        const float *tok = qkv + r * W;
        char *dst[2] = {(char *)kc + ((size_t)bb * NKV + g) * hb,
                        (char *)vc + ((size_t)bb * NKV + g) * hb};
        /* K's and V's values loaded before either is reduced: two rows' loads in flight */
        float x[2][DEC_MAX_HS / 32];
#pragma unroll
        for (int kv = 0; kv < 2; kv++)
#pragma unroll
            for (int k = 0; k < DEC_MAX_HS / 32; k++) {
                const int i = lane + 32 * k;
                float v = 0.0f;
                if (i < HS) {
                    v = qkv_at(tok, bias, col[kv] + i);
                    if (kv == 0 && fr.on) {
                        const int j = i < half ? i : i - half;
                        const double ang = (double)t * fr.f[j];
                        const float c = (float)cos(ang), s = (float)sin(ang);
                        const float p =
                            qkv_at(tok, bias, col[0] + (i < half ? i + half : i - half));
                        v = i < half ? __fsub_rn(__fmul_rn(v, c), __fmul_rn(p, s))
                                     : __fadd_rn(__fmul_rn(v, c), __fmul_rn(p, s));
                    }
                }
                x[kv][k] = v;
            }
#pragma unroll
        for (int kv = 0; kv < 2; kv++) {
            float am = 0.0f;
#pragma unroll
            for (int k = 0; k < DEC_MAX_HS / 32; k++) am = amax_merge_dev(am, x[kv][k]);
            am = warp_amax(am);
            const float sc = current_scale_dev(am, FP8_E4M3_MAX, 0.0f, 0);
            uint8_t *codes = (uint8_t *)dst[kv] + (size_t)t * HS;
#pragma unroll
            for (int k = 0; k < DEC_MAX_HS / 32; k++) {
                const int i = lane + 32 * k;
                if (i < HS) codes[i] = fp8_enc_dev(x[kv][k] * sc, FP8_E4M3);
            }
            if (lane == 0) ((float *)(dst[kv] + soff))[t] = 1.0f / sc;
        }
    }
}

/* Token rows into the cache, vectorized: a group of LPR = HS/4 lanes per (row, K/V head, K or
 * V), lane j holding elements 4j .. 4j+3 of the row (one 16-byte load). A warp holds K groups
 * only or V groups only (GPW = 32/LPR groups of the same kind), so RoPE's work stays in K's
 * warps: element i pairs with i + HS/2, LPR/2 lanes away (one exchange of four floats), and
 * the pair's angle is shared too, the first half of the lanes taking its cosines and the
 * second half its sines (one exchange more) instead of each lane both; the products are
 * rounded one by one, as the CPU's rotation. FP8: the row's amax over its LPR lanes gives the
 * position's scale (the CPU's put_row); the codes are one 4-byte store per lane, BF16 8 bytes,
 * FP32 16. The CPU's values, as kv_write_fp8_kernel gives them, with 32-bit index arithmetic
 * where the row count allows (the element-wise kernels' cost was their per-element 64-bit
 * index divisions and 1- or 2-byte accesses, not the bytes). groups: 2 * pairs rounded up to
 * GPW-multiples. */
template <int KV, int LPR, typename IDX>
__global__ void kv_write_vec_kernel(void *kc, void *vc, const float *__restrict__ qkv,
                                    const float *__restrict__ bias, const int *__restrict__ pos,
                                    IDX groups, IDX pairs, int T, int NH, int NKV, int HS,
                                    int Tmax, size_t hb, size_t soff, rope_freqs fr) {
    constexpr int GPW = 32 / LPR;
    const int j = threadIdx.x % LPR, half = HS / 2, W = (NH + 2 * NKV) * HS;
    const IDX gpb = (IDX)(blockDim.x / LPR);
    /* block-uniform trip count: the exchanges below want every lane of the warp */
    for (IDX qb = (IDX)blockIdx.x * gpb; qb < groups; qb += (IDX)gridDim.x * gpb) {
        const IDX q = qb + (IDX)(threadIdx.x / LPR);
        const int which = (int)((q / GPW) & 1);       /* 0: K, 1: V; the same across a warp */
        const IDX q2 = q / (2 * GPW) * GPW + q % GPW; /* the (row, K/V head) pair */
        const bool live = q2 < pairs;
        const int g = (int)(q2 % (IDX)NKV);
        const IDX r = q2 / (IDX)NKV; /* token row */
        const IDX bb = r / (IDX)T;
        const int t = !live ? 0 : pos ? pos[bb] : (int)(r % (IDX)T);
        const size_t c0 = (size_t)(NH + which * NKV + g) * HS + 4 * j;
        float4 x4 = live ? *(const float4 *)(qkv + (size_t)r * W + c0)
                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (live && bias) add_into(x4, *(const float4 *)(bias + c0));
        float x[4] = {x4.x, x4.y, x4.z, x4.w};
        if (fr.on && which == 0) { /* warp-uniform: the whole warp exchanges */
            const bool first = 4 * j < half;
            float p[4], mine[4], other[4];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                p[c] = __shfl_xor_sync(0xffffffffu, x[c], LPR / 2, LPR);
                const int i = 4 * j + c, jj = first ? i : i - half;
                const double ang = (double)t * fr.f[jj];
                mine[c] = first ? (float)cos(ang) : (float)sin(ang);
            }
#pragma unroll
            for (int c = 0; c < 4; c++)
                other[c] = __shfl_xor_sync(0xffffffffu, mine[c], LPR / 2, LPR);
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float cs = first ? mine[c] : other[c], sn = first ? other[c] : mine[c];
                x[c] = first ? __fsub_rn(__fmul_rn(x[c], cs), __fmul_rn(p[c], sn))
                             : __fadd_rn(__fmul_rn(x[c], cs), __fmul_rn(p[c], sn));
            }
        }
        char *blk = (char *)(which ? vc : kc) + ((size_t)bb * NKV + g) * hb;
        const size_t e = (size_t)t * HS + 4 * j; /* the lane's first element */
        if (KV == FP8T_KV_FP8) {
            float am = 0.0f;
#pragma unroll
            for (int c = 0; c < 4; c++) am = amax_merge_dev(am, x[c]);
#pragma unroll
            for (int o = LPR / 2; o > 0; o >>= 1)
                am = amax_merge_dev(am, __shfl_xor_sync(0xffffffffu, am, o, LPR));
            const float sc = current_scale_dev(am, FP8_E4M3_MAX, 0.0f, 0);
            const uint32_t codes =
                fp8x4_enc_dev(x[0] * sc, x[1] * sc, x[2] * sc, x[3] * sc, FP8_E4M3);
            if (live) *(uint32_t *)(blk + e) = codes;
            if (live && j == 0) ((float *)(blk + soff))[t] = 1.0f / sc;
        } else if (KV == FP8T_KV_BF16) {
            if (live)
                *(uint2 *)((uint16_t *)blk + e) = bf16x4_of(make_float4(x[0], x[1], x[2], x[3]));
        } else {
            if (live) *(float4 *)((float *)blk + e) = make_float4(x[0], x[1], x[2], x[3]);
        }
    }
}

/* a block-wide max / sum every thread gets (red: DEC_THREADS/32 floats of shared memory) */
__device__ __forceinline__ float dec_block_max(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = red[0];
    for (int w = 1; w < DEC_THREADS / 32; w++) m = fmaxf(m, red[w]);
    return m;
}
__device__ __forceinline__ float dec_block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = red[0];
    for (int w = 1; w < DEC_THREADS / 32; w++) s += red[w];
    return s;
}

/* query head h's q (row bb of qkv, qb the same head's slice of the qkv bias or NULL) rotated
 * at position p, element i */
__device__ __forceinline__ float q_rot(const float *__restrict__ qs, const float *__restrict__ qb,
                                       int i, int HS, int p, const rope_freqs &fr) {
    float x = qkv_at(qs, qb, i);
    if (fr.on) {
        const int half = HS / 2, j = i < half ? i : i - half;
        double dc, ds; /* one range reduction for both */
        sincos((double)p * fr.f[j], &ds, &dc);
        const float c = (float)dc, s = (float)ds;
        x = i < half ? x * c - qkv_at(qs, qb, i + half) * s
                     : x * c + qkv_at(qs, qb, i - half) * s;
    }
    return x;
}

/* The generic kernel: one block per (query head, sequence) */
__global__ void __launch_bounds__(DEC_THREADS)
    attn_decode_kernel(float *out, const void *kc, const void *vc, int kv,
                       const float *__restrict__ qkv, const float *__restrict__ bias,
                       const int *__restrict__ pos, int NH, int NKV, int HS, int Tmax, size_t hb,
                       size_t soff, float scale, rope_freqs fr) {
    __shared__ float q[DEC_MAX_HS];
    __shared__ float sc[DEC_CHUNK];
    __shared__ float red[DEC_THREADS / 32];
    const int h = blockIdx.x, bb = blockIdx.y, g = h / (NH / NKV), p = pos[bb];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float *qs = qkv + (size_t)bb * (NH + 2 * NKV) * HS + (size_t)h * HS;
    const float *qb = bias ? bias + (size_t)h * HS : NULL;
    for (int i = tid; i < HS; i += DEC_THREADS) q[i] = q_rot(qs, qb, i, HS, p, fr);
    __syncthreads();
    const char *kb = (const char *)kc + ((size_t)bb * NKV + g) * hb;
    const char *vb = (const char *)vc + ((size_t)bb * NKV + g) * hb;
    float m = -INFINITY, l = 0.0f, acc0 = 0.0f, acc1 = 0.0f;
    for (int t0 = 0; t0 <= p; t0 += DEC_CHUNK) {
        const int n = min(DEC_CHUNK, p + 1 - t0);
        for (int j = warp; j < n; j += DEC_THREADS / 32) {
            const size_t row = (size_t)(t0 + j) * HS;
            const float ks = kv_pos_scale(kb, kv, t0 + j, soff);
            float d = 0.0f;
            for (int i = lane; i < HS; i += 32) d += q[i] * (kv_elem(kb, kv, row + i) * ks);
            d = warp_sum(d);
            if (lane == 0) sc[j] = d * scale;
        }
        __syncthreads();
        float cm = -INFINITY;
        for (int j = tid; j < n; j += DEC_THREADS) cm = fmaxf(cm, sc[j]);
        const float mnew = fmaxf(m, dec_block_max(cm, red));
        float part = 0.0f;
        for (int j = tid; j < n; j += DEC_THREADS) {
            const float e = expf(sc[j] - mnew);
            sc[j] = e;
            part += e;
        }
        const float csum = dec_block_sum(part, red); /* its __syncthreads publish sc */
        const float corr = expf(m - mnew);           /* 0 on the first chunk (m = -inf) */
        l = l * corr + csum;
        acc0 *= corr;
        acc1 *= corr;
        for (int j = 0; j < n; j++) {
            const size_t row = (size_t)(t0 + j) * HS;
            const float vs = kv_pos_scale(vb, kv, t0 + j, soff);
            const float w = sc[j];
            if (tid < HS) acc0 += w * (kv_elem(vb, kv, row + tid) * vs);
            if (tid + DEC_THREADS < HS)
                acc1 += w * (kv_elem(vb, kv, row + tid + DEC_THREADS) * vs);
        }
        m = mnew;
        __syncthreads(); /* sc is rewritten by the next chunk */
    }
    float *o = out + (size_t)bb * NH * HS + (size_t)h * HS;
    const float inv = 1.0f / l;
    if (tid < HS) o[tid] = acc0 * inv;
    if (tid + DEC_THREADS < HS) o[tid + DEC_THREADS] = acc1 * inv;
}

/* bytes per cached element */
template <int KV> struct kv_bytes {
    enum { v = KV == FP8T_KV_FP32 ? 4 : KV == FP8T_KV_BF16 ? 2 : 1 };
};

/* the 16 / EB values of one 16-byte chunk of a cache row (FP8: codes' values, unscaled) */
template <int KV> __device__ __forceinline__ void decode_chunk(float *x, uint4 v) {
    if (KV == FP8T_KV_FP32) {
        x[0] = __uint_as_float(v.x), x[1] = __uint_as_float(v.y);
        x[2] = __uint_as_float(v.z), x[3] = __uint_as_float(v.w);
        return;
    }
    if (KV == FP8T_KV_BF16) {
        const float4 a = f32x4_of_bf16(make_uint2(v.x, v.y)),
                     b = f32x4_of_bf16(make_uint2(v.z, v.w));
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
        x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
        return;
    }
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
            const float2 f = fp8x2_dec_dev((uint16_t)(w[k] >> (8 * e)), FP8_E4M3);
            x[4 * k + e] = f.x, x[4 * k + e + 1] = f.y;
        }
}

/* elements lane * EPL .. + EPL - 1 of a cache row (EPL * EB = 8, 16 or 32 bytes) */
template <int KV, int EPL>
__device__ __forceinline__ void load_lane_dims(float (&x)[EPL], const char *row, int lane) {
    constexpr int EB = kv_bytes<KV>::v, NB = EPL * EB;
    static_assert(NB == 8 || NB == 16 || NB == 32, "8, 16 or 32 bytes a lane");
    const char *p = row + (size_t)lane * NB;
    if (NB >= 16) {
#pragma unroll
        for (int c = 0; c < NB / 16; c++)
            decode_chunk<KV>(x + c * (16 / EB), reinterpret_cast<const uint4 *>(p)[c]);
        return;
    }
    const uint2 u = *reinterpret_cast<const uint2 *>(p);
    float t[16];
    decode_chunk<KV>(t, make_uint4(u.x, u.y, 0u, 0u));
#pragma unroll
    for (int e = 0; e < EPL; e++) x[e] = t[e];
}

/* The split kernel (see the top of the file). grid (nsplit, NKV, B); dynamic shared memory:
 * q [G][HS], scores [G][sl], warp sums [SPLIT_WARPS][SPLIT_GC][HS], (max, sum) [G][2].
 * part [B, NH, nsplit, HS + 2] (nsplit > 1): each split's unnormalized out, max and sum.
 * HS: 32, 64, 128 or 256. The group's heads go GC (<= SPLIT_GC) at a time.
 * Scores: a cached row per 1 to 16 lanes (64 bytes each, in 16-byte loads), dotted with the
 * heads' q (shared memory read by the lanes alike: a broadcast) over each lane's elements in
 * order, then over the row's lanes (a shuffle tree); each row's K read once per GC heads.
 * P·V: a row is LPR lanes' 8-byte pieces (at most 32 lanes; wider rows take more bytes a
 * lane), so a warp load covers RPW = 32 / LPR rows (FP8 at HS 64: 4): warp w takes rows
 * w * RPW .., RPW * SPLIT_WARPS apart; each lane sums its rows in order, the warp's row groups
 * are summed by a shuffle tree, then the warps in order. (A warp reading one row a load, 2
 * bytes a lane for FP8, left the kernel waiting on V: ~10 dependent loads a warp a split.)
 * Each head's sums are in the same order whatever GC. */
template <int KV, int HS, int GC>
__global__ void __launch_bounds__(SPLIT_THREADS, SPLIT_MIN_BLOCKS)
    attn_decode_split_kernel(float *out, float *part, const void *kc, const void *vc,
                             const float *__restrict__ qkv, const float *__restrict__ bias,
                             const int *__restrict__ pos, int NH, int NKV, size_t hb, size_t soff,
                             int sl, int nsplit, float scale, rope_freqs fr) {
    constexpr int EB = kv_bytes<KV>::v, EPC = 16 / EB, CH = HS * EB / 16;
    constexpr int LPS = CH > 4 ? CH / 4 : 1, CPL = CH / LPS; /* lanes per row, chunks per lane */
    extern __shared__ float smem[];
    const int G = NH / NKV;
    float *qsh = smem, *sc = qsh + G * HS, *red = sc + G * sl;
    float *ml = red + SPLIT_WARPS * SPLIT_GC * HS;
    const int split = blockIdx.x, g = blockIdx.y, bb = blockIdx.z, p = pos[bb];
    const int t0 = split * sl, n = min(sl, p + 1 - t0);
    if (n <= 0) return; /* past this sequence's position: the combine skips the split */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const char *kb = (const char *)kc + ((size_t)bb * NKV + g) * hb;
    const char *vb = (const char *)vc + ((size_t)bb * NKV + g) * hb;
    /* scores: LPS lanes per row, 64 bytes of it each (wider spans per lane measured slower).
     * With LPS > 1 every lane runs the same trip count (a row's lanes shuffle); with 1 a lane
     * stops after its last row. A lane's first row is loaded before q is made, so its DRAM
     * latency overlaps RoPE's trigonometry. */
    const int rpp = SPLIT_THREADS / LPS, jend = LPS == 1 ? n : (n + rpp - 1) / rpp * rpp;
    const int sub = tid % LPS, jfirst = tid / LPS;
    uint4 kk[CPL];
    float ks = 0.0f;
    auto load_k = [&](int j) {
        const bool row = j < n;
        const uint4 *kr =
            reinterpret_cast<const uint4 *>(kb + (size_t)(t0 + j) * HS * EB) + sub * CPL;
#pragma unroll
        for (int ch = 0; ch < CPL; ch++) kk[ch] = row ? kr[ch] : make_uint4(0u, 0u, 0u, 0u);
        ks = row ? kv_pos_scale(kb, KV, t0 + j, soff) : 0.0f;
    };
    load_k(jfirst);
    /* the P·V's layout (below): LPR lanes a V row, EPL elements (8 bytes at most) each, RPW
     * rows a warp load */
    constexpr int LPR = HS * EB / 8 < 32 ? HS * EB / 8 : 32, EPL = HS / LPR, RPW = 32 / LPR;
    const int vsub = lane % LPR, vrow = lane / LPR;
    const int jv0 = warp * RPW + vrow, vstep = SPLIT_WARPS * RPW;
    const float *qrow = qkv + (size_t)bb * (NH + 2 * NKV) * HS;
    for (int idx = tid; idx < G * HS; idx += SPLIT_THREADS) {
        const int hh = idx / HS, i = idx - hh * HS;
        const size_t hc = (size_t)(g * G + hh) * HS;
        qsh[idx] = q_rot(qrow + hc, bias ? bias + hc : NULL, i, HS, p, fr);
    }
    __syncthreads();
    for (int j = jfirst; j < jend; j += rpp) {
        const bool row = LPS == 1 || j < n;
        if (j != jfirst) load_k(j);
        for (int h0 = 0; h0 < G; h0 += GC) {
            float d[GC];
#pragma unroll
            for (int c = 0; c < GC; c++) d[c] = 0.0f;
#pragma unroll
            for (int ch = 0; ch < CPL; ch++) {
                float k[EPC];
                decode_chunk<KV>(k, kk[ch]);
#pragma unroll
                for (int c = 0; c < GC; c++) {
                    if (h0 + c >= G) break;
                    const float4 *q4 = reinterpret_cast<const float4 *>(qsh + (h0 + c) * HS +
                                                                        (sub * CPL + ch) * EPC);
#pragma unroll
                    for (int e4 = 0; e4 < EPC / 4; e4++) {
                        const float4 q = q4[e4];
                        d[c] += q.x * k[4 * e4];
                        d[c] += q.y * k[4 * e4 + 1];
                        d[c] += q.z * k[4 * e4 + 2];
                        d[c] += q.w * k[4 * e4 + 3];
                    }
                }
            }
#pragma unroll
            for (int c = 0; c < GC; c++) {
#pragma unroll
                for (int o = 1; o < LPS; o <<= 1) d[c] += __shfl_xor_sync(0xffffffffu, d[c], o);
                if (row && sub == 0 && h0 + c < G)
                    sc[(h0 + c) * sl + j] = (KV == FP8T_KV_FP8 ? d[c] * ks : d[c]) * scale;
            }
        }
    }
    __syncthreads();
    /* each head's softmax over the split: max, exps, sum */
    for (int hh = warp; hh < G; hh += SPLIT_WARPS) {
        float *s = sc + hh * sl;
        float mx = -INFINITY;
        for (int j = lane; j < n; j += 32) mx = fmaxf(mx, s[j]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int j = lane; j < n; j += 32) {
            const float e = expf(s[j] - mx);
            s[j] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        if (lane == 0) ml[2 * hh] = mx, ml[2 * hh + 1] = sum;
    }
    __syncthreads();
    for (int h0 = 0; h0 < G; h0 += GC) {
        float acc[GC][EPL];
#pragma unroll
        for (int c = 0; c < GC; c++)
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[c][e] = 0.0f;
        auto pv_row = [&](int j, const float(&v)[EPL], float vs) {
#pragma unroll
            for (int c = 0; c < GC; c++) {
                if (h0 + c >= G) break;
                const float w =
                    KV == FP8T_KV_FP8 ? sc[(h0 + c) * sl + j] * vs : sc[(h0 + c) * sl + j];
#pragma unroll
                for (int e = 0; e < EPL; e++) acc[c][e] += w * v[e];
            }
        };
#pragma unroll 4 /* V row loads a lane has in flight */
        for (int j = jv0; j < n; j += vstep) {
            float v[EPL];
            load_lane_dims<KV, EPL>(v, vb + (size_t)(t0 + j) * HS * EB, vsub);
            pv_row(j, v, kv_pos_scale(vb, KV, t0 + j, soff));
        }
        /* the warp's row groups summed (lane vsub gets them in the order of the xor tree) */
#pragma unroll
        for (int c = 0; c < GC; c++)
#pragma unroll
            for (int e = 0; e < EPL; e++)
#pragma unroll
                for (int o = LPR; o < 32; o <<= 1)
                    acc[c][e] += __shfl_xor_sync(0xffffffffu, acc[c][e], o);
        if (vrow == 0)
#pragma unroll
            for (int c = 0; c < GC; c++)
#pragma unroll
                for (int e = 0; e < EPL; e++)
                    red[(warp * GC + c) * HS + vsub * EPL + e] = acc[c][e];
        __syncthreads();
        for (int idx = tid; idx < GC * HS; idx += SPLIT_THREADS) {
            const int c = idx / HS, i = idx - c * HS, hh = h0 + c;
            if (hh >= G) continue;
            float o = red[c * HS + i];
            for (int w = 1; w < SPLIT_WARPS; w++) o += red[(w * GC + c) * HS + i];
            const int h = g * G + hh;
            if (nsplit == 1) {
                out[((size_t)bb * NH + h) * HS + i] = o * (1.0f / ml[2 * hh + 1]);
            } else {
                float *pr = part + (((size_t)bb * NH + h) * nsplit + split) * (HS + 2);
                pr[i] = o;
                if (i == 0) pr[HS] = ml[2 * hh], pr[HS + 1] = ml[2 * hh + 1];
            }
        }
        __syncthreads(); /* red is rewritten by the next heads */
    }
}

/* out[b, h] = the splits of part combined: weights exp(m_s - M), in split order; the splits
 * past the sequence's position never ran and are not read. grid (NH, B). */
__global__ void attn_decode_combine_kernel(float *out, const float *__restrict__ part,
                                           const int *__restrict__ pos, int NH, int HS, int sl,
                                           int nsplit) {
    extern __shared__ float wsh[]; /* [nsplit] */
    const int h = blockIdx.x, bb = blockIdx.y;
    const int ns = min(nsplit, pos[bb] / sl + 1);
    const float *pr = part + ((size_t)bb * NH + h) * nsplit * (HS + 2);
    float M = -INFINITY;
    for (int s = 0; s < ns; s++) M = fmaxf(M, pr[(size_t)s * (HS + 2) + HS]);
    for (int s = threadIdx.x; s < ns; s += blockDim.x)
        wsh[s] = expf(pr[(size_t)s * (HS + 2) + HS] - M);
    __syncthreads();
    float L = 0.0f;
    for (int s = 0; s < ns; s++) L += pr[(size_t)s * (HS + 2) + HS + 1] * wsh[s];
    const float inv = 1.0f / L;
    for (int i = threadIdx.x; i < HS; i += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < ns; s++) o += pr[(size_t)s * (HS + 2) + i] * wsh[s];
        out[((size_t)bb * NH + h) * HS + i] = o * inv;
    }
}

static rope_freqs make_freqs(const fp8t_attn_shape *s) {
    rope_freqs fr;
    memset(&fr, 0, sizeof(fr));
    fr.on = s->rope_theta > 0.0f;
    if (fr.on)
        for (int i = 0; i < s->HS / 2; i++) fr.f[i] = fp8t_rope_inv_freq(s, i);
    return fr;
}

static void check_decode_shape(const fp8t_attn_shape *s, int kv, int T, int Tmax) {
    if (s->HS > DEC_MAX_HS || (s->rope_theta > 0.0f && s->HS % 2) || T > Tmax || T < 1 ||
        kv < FP8T_KV_FP32 || kv > FP8T_KV_FP8) {
        FP8T_FATAL("CUDA KV cache: head size %d (at most %d, even with RoPE), %d "
                   "tokens for a cache of %d positions, cache kind %d",
                   s->HS, DEC_MAX_HS, T, Tmax, kv);
    }
}

/* f(K) with K the cache kind kv as a compile-time constant (std::integral_constant): the
 * kernels are templates on it */
template <typename F> static auto with_kv_kind(int kv, F f) {
    if (kv == FP8T_KV_FP32) return f(std::integral_constant<int, FP8T_KV_FP32>());
    if (kv == FP8T_KV_BF16) return f(std::integral_constant<int, FP8T_KV_BF16>());
    return f(std::integral_constant<int, FP8T_KV_FP8>());
}

/* the vectorized cache write for cache kind KV at LPR lanes per row */
template <int KV, int LPR>
static void launch_kv_write_vec(cudaStream_t stream, void *kc, void *vc, const float *qkv,
                                const float *bias, const int *pos, size_t pairs, int T,
                                const fp8t_attn_shape *s, int NKV, int Tmax, size_t hb,
                                size_t soff, const rope_freqs &fr) {
    const size_t gpw = 32 / LPR, groups = 2 * ((pairs + gpw - 1) / gpw * gpw);
    const size_t threads = groups * LPR;
    const unsigned grid = cdiv_u(threads, 256) < 65535u ? cdiv_u(threads, 256) : 65535u;
    with_index_type(groups, [&](auto i) {
        using IDX = decltype(i);
        kv_write_vec_kernel<KV, LPR, IDX>
            <<<grid, 256, 0, stream>>>(kc, vc, qkv, bias, pos, (IDX)groups, (IDX)pairs, T, s->NH,
                                       NKV, s->HS, Tmax, hb, soff, fr);
    });
}
/* the vectorized write at LPR = HS/4 lanes per row, L the first count tried (doubling up to a
 * warp); 0 when HS/4 is none of them */
template <int KV, int L = 2>
static int try_kv_write_vec(cudaStream_t stream, void *kc, void *vc, const float *qkv,
                            const float *bias, const int *pos, size_t pairs, int T,
                            const fp8t_attn_shape *s, int NKV, int Tmax, size_t hb, size_t soff,
                            const rope_freqs &fr) {
    if (s->HS / 4 == L) {
        launch_kv_write_vec<KV, L>(stream, kc, vc, qkv, bias, pos, pairs, T, s, NKV, Tmax, hb,
                                   soff, fr);
        return 1;
    }
    if constexpr (L < 32)
        return try_kv_write_vec<KV, 2 * L>(stream, kc, vc, qkv, bias, pos, pairs, T, s, NKV, Tmax,
                                           hb, soff, fr);
    else
        return 0;
}

static void launch_kv_write(fp8t_backend *b, void *kc, void *vc, int kv, const float *qkv,
                            const int *pos, const fp8t_attn_shape *s, int T, int Tmax) {
    cuda_state *st = cuda_of(b);
    const int NKV = fp8t_attn_nkv(s);
    const size_t rows = (size_t)s->B * T;
    if (!rows || !NKV) return;
    const size_t hb = fp8t_kv_head_bytes(kv, Tmax, s->HS);
    const size_t soff = kv == FP8T_KV_FP8 ? fp8t_kv_scale_offset(Tmax, s->HS) : 0;
    const rope_freqs fr = make_freqs(s);
    const float *bias = s->qkv_bias;
    /* rows of whole 16-byte pieces (HS a multiple of 8: RoPE's halves too) from an aligned
     * qkv (and bias); else the element-wise kernels */
    if (!st->plain && s->HS % 8 == 0 && ((uintptr_t)qkv & 15u) == 0 &&
        ((uintptr_t)bias & 15u) == 0) {
        const size_t pairs = rows * NKV;
        const int done = with_kv_kind(kv, [&](auto K) {
            return try_kv_write_vec<decltype(K)::value>(st->stream, kc, vc, qkv, bias, pos, pairs,
                                                        T, s, NKV, Tmax, hb, soff, fr);
        });
        if (done) {
            CUDA_LAUNCH_CHECK(st);
            return;
        }
    }
    if (kv == FP8T_KV_FP8) {
        const size_t warps = rows * NKV;
        const unsigned grid = cdiv_u(warps, 8) < 65535u ? cdiv_u(warps, 8) : 65535u;
        kv_write_fp8_kernel<<<grid, 256, 0, st->stream>>>(kc, vc, qkv, bias, pos, s->B, T, s->NH,
                                                          NKV, s->HS, Tmax, hb, soff, fr);
        CUDA_LAUNCH_CHECK(st);
        return;
    }
    const size_t total = rows * NKV * ((s->HS + 1) / 2);
    const unsigned grid = cdiv_u(total, 256) < 65535u ? cdiv_u(total, 256) : 65535u;
    kv_write_kernel<<<grid, 256, 0, st->stream>>>(kc, vc, kv == FP8T_KV_BF16, qkv, bias, pos,
                                                  s->B, T, s->NH, NKV, s->HS, Tmax, fr);
    CUDA_LAUNCH_CHECK(st);
}

void cuda_kv_cache_write(fp8t_backend *b, void *kc, void *vc, int kv, const float *qkv,
                         const fp8t_attn_shape *s, int Tmax) {
    check_decode_shape(s, kv, s->T, Tmax);
    launch_kv_write(b, kc, vc, kv, qkv, NULL, s, s->T, Tmax);
}

/* dynamic shared floats of the split kernel at split length sl */
static size_t split_smem_floats(int G, int HS, int sl) {
    return (size_t)G * HS + (size_t)G * sl + (size_t)SPLIT_WARPS * SPLIT_GC * HS + 2u * G;
}

/* the head sizes the split kernel is instantiated for */
static int split_takes_hs(int HS) { return HS == 32 || HS == 64 || HS == 128 || HS == 256; }

/* The split length for this shape (0: the split kernel does not take it): the longest power
 * of two in [32, 512] that still gives 2 blocks per SM, within the shared-memory budget. */
static int split_len(const cuda_state *st, const fp8t_attn_shape *s, int Tmax) {
    const int NKV = fp8t_attn_nkv(s), G = s->NH / NKV, HS = s->HS;
    if (st->plain || !split_takes_hs(HS)) return 0;
    int sl = 512;
    while (sl > 32 && split_smem_floats(G, HS, sl) > SPLIT_SMEM_FLOATS) sl /= 2;
    if (split_smem_floats(G, HS, sl) > SPLIT_SMEM_FLOATS) return 0;
    const size_t want = 2u * (size_t)st->num_sms;
    while (sl > 32 && (size_t)s->B * NKV * ((Tmax + sl - 1) / sl) < want) sl /= 2;
    return sl;
}

/* the split kernel for cache kind KV at head size HS, its heads per pass (GC) from the group
 * size G */
template <int KV, int HS, typename... A>
static void launch_split_gc(int G, dim3 grid, size_t smem, cudaStream_t stream, A... a) {
    if (G == 1)
        attn_decode_split_kernel<KV, HS, 1><<<grid, SPLIT_THREADS, smem, stream>>>(a...);
    else if (G == 2)
        attn_decode_split_kernel<KV, HS, 2><<<grid, SPLIT_THREADS, smem, stream>>>(a...);
    else
        attn_decode_split_kernel<KV, HS, SPLIT_GC><<<grid, SPLIT_THREADS, smem, stream>>>(a...);
}
template <typename... A>
static void launch_split(int kv, int HS, int G, dim3 grid, size_t smem, cudaStream_t stream,
                         A... a) {
    with_kv_kind(kv, [&](auto K) {
        constexpr int KV = decltype(K)::value;
        switch (HS) { /* split_takes_hs's sizes */
        case 32: launch_split_gc<KV, 32>(G, grid, smem, stream, a...); break;
        case 64: launch_split_gc<KV, 64>(G, grid, smem, stream, a...); break;
        case 128: launch_split_gc<KV, 128>(G, grid, smem, stream, a...); break;
        default: launch_split_gc<KV, 256>(G, grid, smem, stream, a...); break;
        }
    });
}

void cuda_attention_decode(fp8t_backend *b, float *out, void *kc, void *vc, int kv,
                           const float *qkv, const int *pos, const fp8t_attn_shape *s, int Tmax) {
    check_decode_shape(s, kv, 1, Tmax);
    if (s->B < 1) return;
    cuda_state *st = cuda_of(b);
    /* the new tokens' K and V first (stream order): every query head of a group reads them */
    launch_kv_write(b, kc, vc, kv, qkv, pos, s, 1, Tmax);
    const int NKV = fp8t_attn_nkv(s), HS = s->HS;
    const size_t hb = fp8t_kv_head_bytes(kv, Tmax, HS), soff = fp8t_kv_scale_offset(Tmax, HS);
    const float scale = 1.0f / sqrtf((float)HS);
    const int sl = split_len(st, s, Tmax);
    if (sl > 0) {
        const int nsplit = (Tmax + sl - 1) / sl, G = s->NH / NKV;
        float *part =
            nsplit > 1
                ? (float *)cuda_scratch(b, SCR_ATTN,
                                        (size_t)s->B * s->NH * nsplit * (HS + 2) * sizeof(float))
                : NULL;
        const size_t smem = split_smem_floats(G, HS, sl) * sizeof(float);
        dim3 grid((unsigned)nsplit, (unsigned)NKV, (unsigned)s->B);
        const rope_freqs fr = make_freqs(s);
        launch_split(kv, HS, G, grid, smem, st->stream, out, part, kc, vc, qkv, s->qkv_bias, pos,
                     s->NH, NKV, hb, soff, sl, nsplit, scale, fr);
        CUDA_LAUNCH_CHECK(st);
        if (nsplit > 1) {
            attn_decode_combine_kernel<<<dim3((unsigned)s->NH, (unsigned)s->B), 64,
                                         (size_t)nsplit * sizeof(float), st->stream>>>(
                out, part, pos, s->NH, HS, sl, nsplit);
            CUDA_LAUNCH_CHECK(st);
        }
        return;
    }
    dim3 grid((unsigned)s->NH, (unsigned)s->B);
    attn_decode_kernel<<<grid, DEC_THREADS, 0, st->stream>>>(out, kc, vc, kv, qkv, s->qkv_bias,
                                                             pos, s->NH, NKV, HS, Tmax, hb, soff,
                                                             scale, make_freqs(s));
    CUDA_LAUNCH_CHECK(st);
}

/* out[i, c] = widen(wte[tok_i * ld + c]) + wpe[t_i * C + c], t_i = pos ? pos[i] : i % T: one
 * thread per element */
__global__ void embedding_bf16_kernel(float *out, const int *__restrict__ tokens,
                                      const uint16_t *__restrict__ wte, int ld,
                                      const float *__restrict__ wpe, const int *__restrict__ pos,
                                      int T, int C, size_t n) {
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t i = idx / C;
        const int c = (int)(idx % C);
        float v = __uint_as_float((uint32_t)wte[(size_t)tokens[i] * ld + c] << 16);
        if (wpe) v += wpe[(pos ? (size_t)pos[i] : i % T) * C + c];
        out[idx] = v;
    }
}

void cuda_embedding_forward_bf16(fp8t_backend *b, float *out, const int *tokens,
                                 const uint16_t *wte, int ld, const float *wpe, const int *pos,
                                 int B, int T, int C) {
    const size_t n = (size_t)B * T * C;
    if (!n) return;
    cuda_state *st = cuda_of(b);
    const unsigned grid = cdiv_u(n, 256) < 65535u ? cdiv_u(n, 256) : 65535u;
    embedding_bf16_kernel<<<grid, 256, 0, st->stream>>>(out, tokens, wte, ld, wpe, pos, T, C, n);
    CUDA_LAUNCH_CHECK(st);
}

/* the E4M3 table's lookup: decode * scale_inv (+ wpe), one thread per element */
__global__ void embedding_fp8_kernel(float *out, const int *__restrict__ tokens,
                                     const uint8_t *__restrict__ codes, int ld,
                                     const float *__restrict__ scale_inv,
                                     const float *__restrict__ wpe, const int *__restrict__ pos,
                                     int T, int C, size_t n) {
    const float si = *scale_inv;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t i = idx / C;
        const int c = (int)(idx % C);
        /* the product rounded on its own (no FMA with the add): the CPU's bits */
        float v = __fmul_rn(fp8_dec_dev(codes[(size_t)tokens[i] * ld + c], FP8_E4M3), si);
        if (wpe) v += wpe[(pos ? (size_t)pos[i] : i % T) * C + c];
        out[idx] = v;
    }
}

void cuda_embedding_forward_fp8(fp8t_backend *b, float *out, const int *tokens,
                                const uint8_t *codes, int ld, const float *scale_inv,
                                const float *wpe, const int *pos, int B, int T, int C) {
    const size_t n = (size_t)B * T * C;
    if (!n) return;
    cuda_state *st = cuda_of(b);
    const unsigned grid = cdiv_u(n, 256) < 65535u ? cdiv_u(n, 256) : 65535u;
    embedding_fp8_kernel<<<grid, 256, 0, st->stream>>>(out, tokens, codes, ld, scale_inv, wpe,
                                                       pos, T, C, n);
    CUDA_LAUNCH_CHECK(st);
}
