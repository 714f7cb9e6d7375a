/* CUDA backend — causal multi-head self-attention, forward and backward, FP32.
 *
 * Both directions start with a "prep" kernel that copies q, k, v out of
 * qkv[B,T,(NH+2NKV)*HS] into per-head layouts [B*NH, T, HS] (contiguous rows for coalesced tile
 * loads) and applies RoPE to q and k there. Grouped-query attention (NKV < NH): query head h
 * gets a copy of K/V head h / (NH/NKV), so the cores below always see NH full heads. The
 * backward ends with a "post" kernel that sums dk, dv over the query heads of a group (in head
 * order: deterministic; nothing to sum without GQA), un-rotates dq, dk (the transpose of the
 * rotation) and scatters dq|dk|dv into dqkv (every element written).
 *
 * The BF16 tensor-core cores live in their own files: cuDNN's fused attention
 * (cuda_attention_cudnn.cu, tried first where the attention option asks for it), flash
 * (cuda_attention_flash.cu) and gemm (cuda_attention_gemm.cu). Here, two FP32
 * implementations, same math (softmax with the saved log-sum-exp, no [T,T] matrix kept):
 *  - simple (--cuda-attn simple or --disable cuda-fusion; any head size <= 256): one
 *    warp per (b, h, query row) streaming over keys with an online softmax; backward: one warp
 *    per query row for dq and one warp per key row for dk, dv, both recomputing the
 *    probabilities from lse and D_t = dot(dout_t, out_t).
 *  - tiled (default for head sizes 32, 64, 128): flash-attention style 64x64 tiles in shared
 *    memory, 128 threads, each thread a 4x8 block of scores. Backward in two kernels without
 *    atomics: dk, dv per key tile (looping over query tiles) and dq per query tile (looping
 *    over key tiles); both recompute P. Deterministic.
 *
 * RoPE (rotate-half): pair (i, i + HS/2) of a head at position t is rotated by the angle
 * t * inv_freq_i (fp8t_rope_inv_freq: theta^(-2i/HS), Llama-3 scaled when asked). The cos/sin
 * table is computed on the host with the same expressions as the CPU backend, so both backends
 * rotate by bit-identical factors; it is cached on the device per (T, HS, theta, scaling)
 * (recomputed every call in plain mode). */
#include <math.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"

/* ---------------------------------------------------------------------------------------- */
/* RoPE table */

/* cos/sin [T][half] exactly as the CPU backend computes them (rope_tables in
 * cpu_attention.c: the frequency of fp8t_rope_inv_freq, angles in double, rounded once to
 * float), so the factors are identical. */
static void rope_table_host(float *cosv, float *sinv, const fp8t_attn_shape *sh) {
    const int T = sh->T, half = sh->HS / 2;
    for (int i = 0; i < half; i++) {
        const double freq = fp8t_rope_inv_freq(sh, i);
        for (int t = 0; t < T; t++) {
            double ang = (double)t * freq;
            cosv[(size_t)t * half + i] = (float)cos(ang);
            sinv[(size_t)t * half + i] = (float)sin(ang);
        }
    }
}

static int same_scaling(const fp8t_rope_scaling *a, const fp8t_rope_scaling *b) {
    return a->type == b->type && a->factor == b->factor &&
           a->low_freq_factor == b->low_freq_factor &&
           a->high_freq_factor == b->high_freq_factor &&
           a->original_max_pos == b->original_max_pos;
}

/* Device cos/sin tables for the shape's (T, HS, theta, scaling); NULL pointers when
 * rope_theta <= 0. */
static void rope_tables(fp8t_backend *b, const fp8t_attn_shape *sh, const float **cos_out,
                        const float **sin_out) {
    cuda_state *s = cuda_of(b);
    const int T = sh->T, HS = sh->HS;
    const float theta = sh->rope_theta;
    *cos_out = *sin_out = NULL;
    if (!(theta > 0.0f)) return;
    int half = HS / 2;
    if (!s->plain && s->rope_cos && s->rope_T >= T && s->rope_half == half &&
        s->rope_theta == theta && same_scaling(&s->rope_scaling, &sh->rope_scaling)) {
        /* rows depend only on t, so a table for a longer T serves shorter ones */
        *cos_out = s->rope_cos;
        *sin_out = s->rope_sin;
        return;
    }
    size_t n = (size_t)T * half;
    float *h = (float *)malloc(2 * n * sizeof(float) + 1);
    if (!h) {
        FP8T_FATAL("out of host memory");
    }
    rope_table_host(h, h + n, sh);
    CUDA_CHECK(cudaStreamSynchronize(s->stream)); /* the old tables may be in use */
    if (s->rope_cos) CUDA_CHECK(cudaFree(s->rope_cos));
    if (s->rope_sin) CUDA_CHECK(cudaFree(s->rope_sin));
    CUDA_CHECK(cudaMalloc(&s->rope_cos, n * sizeof(float) + 16));
    CUDA_CHECK(cudaMalloc(&s->rope_sin, n * sizeof(float) + 16));
    CUDA_CHECK(cudaMemcpy(s->rope_cos, h, n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(s->rope_sin, h + n, n * sizeof(float), cudaMemcpyHostToDevice));
    free(h);
    s->rope_T = T;
    s->rope_half = half;
    s->rope_theta = theta;
    s->rope_scaling = sh->rope_scaling;
    *cos_out = s->rope_cos;
    *sin_out = s->rope_sin;
}

/* ---------------------------------------------------------------------------------------- */
/* prep / post */

/* q, k, v [BH, T, HS] from qkv [B, T, (NH + 2 NKV) HS]; query head h's k, v are K/V head
 * h / (NH/NKV)'s; q, k rotated when cosv != NULL. One thread per (b, t, h, i) with
 * i < ceil(HS/2): it handles elements i and i + HS/2. */
__global__ void attn_prep_kernel(float *q, float *k, float *v, const float *__restrict__ qkv,
                                 const float *__restrict__ cosv, const float *__restrict__ sinv,
                                 int B, int T, int NH, int NKV, int HS) {
    int half = (HS + 1) / 2;
    size_t total = (size_t)B * T * NH * half;
    size_t C = (size_t)NH * HS, CKV = (size_t)NKV * HS;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % half);
        size_t r = idx / half;
        int h = (int)(r % NH);
        r /= NH;
        int t = (int)(r % T);
        int bb = (int)(r / T);
        const float *tok = qkv + ((size_t)bb * T + t) * (C + 2 * CKV);
        const float *src = tok + (size_t)h * HS;                     /* q of head h */
        const float *ksrc = tok + C + (size_t)(h / (NH / NKV)) * HS; /* its group's k */
        const float *vsrc = ksrc + CKV;                              /* and v */
        size_t dst = (((size_t)bb * NH + h) * T + t) * HS;
        int i2 = i + HS / 2; /* odd HS (never rotated): the middle element is visited twice */
        float q1 = src[i], q2 = src[i2];
        float k1 = ksrc[i], k2 = ksrc[i2];
        v[dst + i] = vsrc[i];
        v[dst + i2] = vsrc[i2];
        if (cosv) {
            float c = cosv[(size_t)t * (HS / 2) + i], s = sinv[(size_t)t * (HS / 2) + i];
            q[dst + i] = q1 * c - q2 * s;
            q[dst + i2] = q2 * c + q1 * s;
            k[dst + i] = k1 * c - k2 * s;
            k[dst + i2] = k2 * c + k1 * s;
        } else {
            q[dst + i] = q1, q[dst + i2] = q2;
            k[dst + i] = k1, k[dst + i2] = k2;
        }
    }
}

/* dqkv [B, T, (NH + 2 NKV) HS] from dq, dk, dv [BH, T, HS]: head slot hh < NH is query head
 * hh (dq un-rotated: the transpose of the rotation); slot NH + kh is K/V head kh, whose dk, dv
 * are the sums over its group's query heads kh*G .. kh*G + G-1 (G = NH/NKV), added in that
 * order from the first (no sum when G = 1: then the bits are those of plain multi-head
 * attention), dk un-rotated after the sum (the CPU backend's order). One thread per
 * (b, t, slot, i), i < ceil(HS/2): elements i and i + HS/2. */
__global__ void attn_post_kernel(float *dqkv, const float *__restrict__ dq,
                                 const float *__restrict__ dk, const float *__restrict__ dv,
                                 const float *__restrict__ cosv, const float *__restrict__ sinv,
                                 int B, int T, int NH, int NKV, int HS) {
    int half = (HS + 1) / 2;
    const int slots = NH + NKV, G = NH / NKV;
    size_t total = (size_t)B * T * slots * half;
    size_t C = (size_t)NH * HS, CKV = (size_t)NKV * HS;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % half);
        size_t r = idx / half;
        int hh = (int)(r % slots);
        r /= slots;
        int t = (int)(r % T);
        int bb = (int)(r / T);
        float *tok = dqkv + ((size_t)bb * T + t) * (C + 2 * CKV);
        int i2 = i + HS / 2;
        float x1, x2, v1 = 0.0f, v2 = 0.0f;
        float *dst;
        if (hh < NH) {
            size_t src = (((size_t)bb * NH + hh) * T + t) * HS;
            x1 = dq[src + i], x2 = dq[src + i2];
            dst = tok + (size_t)hh * HS;
        } else {
            const int kh = hh - NH;
            const size_t stride = (size_t)T * HS; /* the same token, the next query head */
            size_t src = (((size_t)bb * NH + (size_t)kh * G) * T + t) * HS;
            x1 = dk[src + i], x2 = dk[src + i2];
            v1 = dv[src + i], v2 = dv[src + i2];
            for (int g = 1; g < G; g++) {
                src += stride;
                x1 += dk[src + i], x2 += dk[src + i2];
                v1 += dv[src + i], v2 += dv[src + i2];
            }
            dst = tok + C + (size_t)kh * HS;
        }
        if (cosv) {
            float c = cosv[(size_t)t * (HS / 2) + i], s = sinv[(size_t)t * (HS / 2) + i];
            dst[i] = x1 * c + x2 * s;
            dst[i2] = x2 * c - x1 * s;
        } else {
            dst[i] = x1, dst[i2] = x2;
        }
        if (hh >= NH) {
            dst[CKV + i] = v1;
            dst[CKV + i2] = v2;
        }
    }
}

/* D[bh, t] = dot(dout[b, t, h, :], out[b, t, h, :]): warp per row */
__global__ void attn_rowdot_kernel(float *Dv, const float *__restrict__ dout,
                                   const float *__restrict__ out, int B, int T, int NH, int HS) {
    size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (size_t)B * NH * T) return;
    int t = (int)(w % T);
    size_t bh = w / T;
    int h = (int)(bh % NH), bb = (int)(bh / NH);
    size_t off = ((size_t)bb * T + t) * NH * HS + (size_t)h * HS;
    float acc = 0.0f;
    for (int d = lane; d < HS; d += 32) acc += dout[off + d] * out[off + d];
    acc = warp_sum(acc);
    if (lane == 0) Dv[w] = acc;
}

/* ---------------------------------------------------------------------------------------- */
/* simple kernels: a warp per row, lane owns head dims lane, lane+32, ... (HS <= 256) */

#define SIMPLE_MAXJ 8

__global__ void attn_fwd_simple_kernel(float *out, float *lse, const float *__restrict__ q,
                                       const float *__restrict__ k, const float *__restrict__ v,
                                       int B, int T, int NH, int HS, float scale) {
    size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (size_t)B * NH * T) return;
    int t = (int)(w % T);
    size_t bh = w / T;
    const float *qr = q + w * HS;
    const float *kb = k + bh * T * HS, *vb = v + bh * T * HS;
    float qv[SIMPLE_MAXJ], o[SIMPLE_MAXJ];
#pragma unroll
    for (int j = 0; j < SIMPLE_MAXJ; j++) {
        int d = lane + 32 * j;
        qv[j] = d < HS ? qr[d] : 0.0f;
        o[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int s = 0; s <= t; s++) {
        const float *kr = kb + (size_t)s * HS;
        float part = 0.0f;
#pragma unroll
        for (int j = 0; j < SIMPLE_MAXJ; j++) {
            int d = lane + 32 * j;
            if (d < HS) part += qv[j] * kr[d];
        }
        float sc = warp_sum(part) * scale;
        float m_new = fmaxf(m, sc);
        float alpha = expf(m - m_new); /* m = -inf at s = 0: exp(-inf) = 0 */
        float p = expf(sc - m_new);
        l = l * alpha + p;
        const float *vr = vb + (size_t)s * HS;
#pragma unroll
        for (int j = 0; j < SIMPLE_MAXJ; j++) {
            int d = lane + 32 * j;
            if (d < HS) o[j] = o[j] * alpha + p * vr[d];
        }
        m = m_new;
    }
    int h = (int)(bh % NH), bb = (int)(bh / NH);
    float *orow = out + ((size_t)bb * T + t) * NH * HS + (size_t)h * HS;
    float inv = 1.0f / l;
#pragma unroll
    for (int j = 0; j < SIMPLE_MAXJ; j++) {
        int d = lane + 32 * j;
        if (d < HS) orow[d] = o[j] * inv;
    }
    if (lane == 0) lse[w] = m + logf(l);
}

/* dq'[bh, t] = scale * sum_{s<=t} P_ts (dP_ts - D_t) k_s */
__global__ void
attn_bwd_dq_simple_kernel(float *dq, const float *__restrict__ q, const float *__restrict__ k,
                          const float *__restrict__ v, const float *__restrict__ dout,
                          const float *__restrict__ lse, const float *__restrict__ Dv, int B,
                          int T, int NH, int HS, float scale) {
    size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (size_t)B * NH * T) return;
    int t = (int)(w % T);
    size_t bh = w / T;
    int h = (int)(bh % NH), bb = (int)(bh / NH);
    const float *qr = q + w * HS;
    const float *dor = dout + ((size_t)bb * T + t) * NH * HS + (size_t)h * HS;
    const float *kb = k + bh * T * HS, *vb = v + bh * T * HS;
    float qv[SIMPLE_MAXJ], dov[SIMPLE_MAXJ], acc[SIMPLE_MAXJ];
#pragma unroll
    for (int j = 0; j < SIMPLE_MAXJ; j++) {
        int d = lane + 32 * j;
        qv[j] = d < HS ? qr[d] : 0.0f;
        dov[j] = d < HS ? dor[d] : 0.0f;
        acc[j] = 0.0f;
    }
    float L = lse[w], Dt = Dv[w];
    for (int s = 0; s <= t; s++) {
        const float *kr = kb + (size_t)s * HS, *vr = vb + (size_t)s * HS;
        float ps = 0.0f, pd = 0.0f;
#pragma unroll
        for (int j = 0; j < SIMPLE_MAXJ; j++) {
            int d = lane + 32 * j;
            if (d < HS) ps += qv[j] * kr[d], pd += dov[j] * vr[d];
        }
        float p = expf(warp_sum(ps) * scale - L);
        float ds = p * (warp_sum(pd) - Dt);
#pragma unroll
        for (int j = 0; j < SIMPLE_MAXJ; j++) {
            int d = lane + 32 * j;
            if (d < HS) acc[j] += ds * kr[d];
        }
    }
    float *o = dq + w * HS;
#pragma unroll
    for (int j = 0; j < SIMPLE_MAXJ; j++) {
        int d = lane + 32 * j;
        if (d < HS) o[d] = acc[j] * scale;
    }
}

/* dv[bh, s] = sum_{t>=s} P_ts dout_t;  dk'[bh, s] = scale * sum_{t>=s} P_ts (dP_ts - D_t) q_t */
__global__ void attn_bwd_dkdv_simple_kernel(
    float *dk, float *dv, const float *__restrict__ q, const float *__restrict__ k,
    const float *__restrict__ v, const float *__restrict__ dout, const float *__restrict__ lse,
    const float *__restrict__ Dv, int B, int T, int NH, int HS, float scale) {
    size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (size_t)B * NH * T) return;
    int s = (int)(w % T);
    size_t bh = w / T;
    int h = (int)(bh % NH), bb = (int)(bh / NH);
    const float *kr = k + w * HS, *vr = v + w * HS;
    float kv[SIMPLE_MAXJ], vv[SIMPLE_MAXJ], adk[SIMPLE_MAXJ], adv[SIMPLE_MAXJ];
#pragma unroll
    for (int j = 0; j < SIMPLE_MAXJ; j++) {
        int d = lane + 32 * j;
        kv[j] = d < HS ? kr[d] : 0.0f;
        vv[j] = d < HS ? vr[d] : 0.0f;
        adk[j] = adv[j] = 0.0f;
    }
    for (int t = s; t < T; t++) {
        const float *qr = q + (bh * T + t) * HS;
        const float *dor = dout + ((size_t)bb * T + t) * NH * HS + (size_t)h * HS;
        float ps = 0.0f, pd = 0.0f;
#pragma unroll
        for (int j = 0; j < SIMPLE_MAXJ; j++) {
            int d = lane + 32 * j;
            if (d < HS) ps += qr[d] * kv[j], pd += dor[d] * vv[j];
        }
        float p = expf(warp_sum(ps) * scale - lse[bh * T + t]);
        float ds = p * (warp_sum(pd) - Dv[bh * T + t]);
#pragma unroll
        for (int j = 0; j < SIMPLE_MAXJ; j++) {
            int d = lane + 32 * j;
            if (d < HS) adv[j] += p * dor[d], adk[j] += ds * qr[d];
        }
    }
#pragma unroll
    for (int j = 0; j < SIMPLE_MAXJ; j++) {
        int d = lane + 32 * j;
        if (d < HS) dk[w * HS + d] = adk[j] * scale, dv[w * HS + d] = adv[j];
    }
}

/* ---------------------------------------------------------------------------------------- */
/* tiled kernels. 64x64 tiles, 128 threads: thread tid has row group rg = tid / 8 (rows
 * 4rg..4rg+3 of the tile) and column group cg = tid % 8 (tile columns cg + 8j, j < 8, of a
 * score block; head dims 32g + 4cg .. +3, g < D/32, of an output block). Shared-memory rows
 * are padded (D + 4 floats) so the 16-byte loads of 8 consecutive lanes hit distinct banks. */

#define AT 64
#define AT_THREADS 128
#define AT_LDP (AT + 1)

/* rows [r0, r0+64) of a [T, D] row-major matrix (row stride ld floats) into s[64][D+4];
 * rows >= T are zero. */
template <int D>
__device__ __forceinline__ void load_tile(float *s, const float *__restrict__ g, size_t ld,
                                          int r0, int T) {
    constexpr int LD = D + 4, V4 = D / 4;
    for (int idx = threadIdx.x; idx < AT * V4; idx += AT_THREADS) {
        int r = idx / V4, c4 = idx % V4;
        float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r0 + r < T) val = *(const float4 *)(g + (size_t)(r0 + r) * ld + c4 * 4);
        *(float4 *)(s + r * LD + c4 * 4) = val;
    }
}

/* acc[i][j] += dot(A[4rg+i], B[cg+8j]) over D, A and B in shared memory [64][D+4] */
template <int D>
__device__ __forceinline__ void tile_dots(float (&acc)[4][8], const float *A, const float *Bm,
                                          int rg, int cg) {
    constexpr int LD = D + 4;
#pragma unroll 4
    for (int d = 0; d < D; d += 4) {
        float4 a[4], bb[8];
#pragma unroll
        for (int i = 0; i < 4; i++) a[i] = *(const float4 *)(A + (4 * rg + i) * LD + d);
#pragma unroll
        for (int j = 0; j < 8; j++) bb[j] = *(const float4 *)(Bm + (cg + 8 * j) * LD + d);
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                acc[i][j] = fmaf(a[i].x, bb[j].x, acc[i][j]);
                acc[i][j] = fmaf(a[i].y, bb[j].y, acc[i][j]);
                acc[i][j] = fmaf(a[i].z, bb[j].z, acc[i][j]);
                acc[i][j] = fmaf(a[i].w, bb[j].w, acc[i][j]);
            }
    }
}

/* o[i][4g+e] += sum_c P[4rg+i][c] * M[c][32g + 4cg + e], P [64][AT_LDP], M [64][D+4] */
template <int D>
__device__ __forceinline__ void tile_pv(float (&o)[4][D / 8], const float *P, const float *M,
                                        int rg, int cg) {
    constexpr int LD = D + 4, G = D / 32;
#pragma unroll 4
    for (int c = 0; c < AT; c++) {
        float p[4];
#pragma unroll
        for (int i = 0; i < 4; i++) p[i] = P[(4 * rg + i) * AT_LDP + c];
#pragma unroll
        for (int g = 0; g < G; g++) {
            float4 mv = *(const float4 *)(M + c * LD + 32 * g + 4 * cg);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                o[i][4 * g + 0] = fmaf(p[i], mv.x, o[i][4 * g + 0]);
                o[i][4 * g + 1] = fmaf(p[i], mv.y, o[i][4 * g + 1]);
                o[i][4 * g + 2] = fmaf(p[i], mv.z, o[i][4 * g + 2]);
                o[i][4 * g + 3] = fmaf(p[i], mv.w, o[i][4 * g + 3]);
            }
        }
    }
}

template <int D> static size_t fwd_smem_bytes() {
    return (size_t)(3 * AT * (D + 4) + AT * AT_LDP) * sizeof(float);
}
template <int D> static size_t dq_smem_bytes() {
    return (size_t)(4 * AT * (D + 4) + AT * AT_LDP) * sizeof(float);
}
template <int D> static size_t dkdv_smem_bytes() {
    return (size_t)(4 * AT * (D + 4) + 2 * AT * AT_LDP + 2 * AT) * sizeof(float);
}

template <int D>
__global__ void __launch_bounds__(AT_THREADS)
    attn_fwd_tiled_kernel(float *out, float *lse, const float *__restrict__ q,
                          const float *__restrict__ k, const float *__restrict__ v, int T, int NH,
                          float scale) {
    constexpr int LD = D + 4, G = D / 32;
    extern __shared__ float4 smem4[];
    float *Qs = (float *)smem4, *Ks = Qs + AT * LD, *Vs = Ks + AT * LD, *Ps = Vs + AT * LD;
    int nT = (T + AT - 1) / AT;
    int qt = nT - 1 - (int)blockIdx.x; /* longest rows first */
    size_t bh = blockIdx.y;
    int tid = threadIdx.x, rg = tid >> 3, cg = tid & 7;
    const float *qb = q + bh * T * D, *kb = k + bh * T * D, *vb = v + bh * T * D;
    load_tile<D>(Qs, qb, D, qt * AT, T);
    float m[4], l[4], o[4][D / 8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
        for (int e = 0; e < D / 8; e++) o[i][e] = 0.0f;
    }
    for (int kt = 0; kt <= qt; kt++) {
        __syncthreads(); /* the previous tile's K, V, P are no longer read */
        load_tile<D>(Ks, kb, D, kt * AT, T);
        load_tile<D>(Vs, vb, D, kt * AT, T);
        __syncthreads();
        float sc[4][8];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 8; j++) sc[i][j] = 0.0f;
        tile_dots<D>(sc, Qs, Ks, rg, cg);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = qt * AT + 4 * rg + i;
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int col = kt * AT + cg + 8 * j;
                float sv = (col <= row && col < T) ? sc[i][j] * scale : -INFINITY;
                sc[i][j] = sv;
                mx = fmaxf(mx, sv);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            float m_new = fmaxf(m[i], mx);
            float alpha = m_new == -INFINITY ? 1.0f : expf(m[i] - m_new);
            float rs = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float p = sc[i][j] == -INFINITY ? 0.0f : expf(sc[i][j] - m_new);
                sc[i][j] = p;
                rs += p;
            }
            rs += __shfl_xor_sync(0xffffffffu, rs, 1);
            rs += __shfl_xor_sync(0xffffffffu, rs, 2);
            rs += __shfl_xor_sync(0xffffffffu, rs, 4);
            l[i] = l[i] * alpha + rs;
            m[i] = m_new;
#pragma unroll
            for (int e = 0; e < D / 8; e++) o[i][e] *= alpha;
#pragma unroll
            for (int j = 0; j < 8; j++) Ps[(4 * rg + i) * AT_LDP + cg + 8 * j] = sc[i][j];
        }
        __syncthreads();
        tile_pv<D>(o, Ps, Vs, rg, cg);
    }
    int NHD = NH * D;
    int h = (int)(bh % NH), bb = (int)(bh / NH);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int row = qt * AT + 4 * rg + i;
        if (row >= T) continue;
        float inv = 1.0f / l[i];
        float *orow = out + ((size_t)bb * T + row) * NHD + (size_t)h * D;
#pragma unroll
        for (int g = 0; g < G; g++) {
            float4 val = make_float4(o[i][4 * g] * inv, o[i][4 * g + 1] * inv,
                                     o[i][4 * g + 2] * inv, o[i][4 * g + 3] * inv);
            *(float4 *)(orow + 32 * g + 4 * cg) = val;
        }
        if (cg == 0) lse[bh * T + row] = m[i] + logf(l[i]);
    }
}

/* dq' per query tile: loops over key tiles kt <= qt; dS to shared, dq += dS K */
template <int D>
__global__ void __launch_bounds__(AT_THREADS)
    attn_bwd_dq_tiled_kernel(float *dq, const float *__restrict__ q, const float *__restrict__ k,
                             const float *__restrict__ v, const float *__restrict__ dout,
                             const float *__restrict__ lse, const float *__restrict__ Dv, int T,
                             int NH, float scale) {
    constexpr int LD = D + 4, G = D / 32;
    extern __shared__ float4 smem4[];
    float *Qs = (float *)smem4, *dOs = Qs + AT * LD, *Ks = dOs + AT * LD, *Vs = Ks + AT * LD;
    float *dSs = Vs + AT * LD;
    int nT = (T + AT - 1) / AT;
    int qt = nT - 1 - (int)blockIdx.x;
    size_t bh = blockIdx.y;
    int h = (int)(bh % NH), bb = (int)(bh / NH);
    int tid = threadIdx.x, rg = tid >> 3, cg = tid & 7;
    const float *qb = q + bh * T * D, *kb = k + bh * T * D, *vb = v + bh * T * D;
    const float *dob = dout + (size_t)bb * T * NH * D + (size_t)h * D;
    load_tile<D>(Qs, qb, D, qt * AT, T);
    load_tile<D>(dOs, dob, (size_t)NH * D, qt * AT, T);
    float L[4], Dt[4], acc[4][D / 8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int row = qt * AT + 4 * rg + i;
        L[i] = row < T ? lse[bh * T + row] : 0.0f;
        Dt[i] = row < T ? Dv[bh * T + row] : 0.0f;
#pragma unroll
        for (int e = 0; e < D / 8; e++) acc[i][e] = 0.0f;
    }
    for (int kt = 0; kt <= qt; kt++) {
        __syncthreads();
        load_tile<D>(Ks, kb, D, kt * AT, T);
        load_tile<D>(Vs, vb, D, kt * AT, T);
        __syncthreads();
        float sc[4][8], dp[4][8];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 8; j++) sc[i][j] = 0.0f, dp[i][j] = 0.0f;
        tile_dots<D>(sc, Qs, Ks, rg, cg);
        tile_dots<D>(dp, dOs, Vs, rg, cg);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = qt * AT + 4 * rg + i;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int col = kt * AT + cg + 8 * j;
                float p =
                    (col <= row && col < T && row < T) ? expf(sc[i][j] * scale - L[i]) : 0.0f;
                dSs[(4 * rg + i) * AT_LDP + cg + 8 * j] = p * (dp[i][j] - Dt[i]);
            }
        }
        __syncthreads();
        tile_pv<D>(acc, dSs, Ks, rg, cg);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int row = qt * AT + 4 * rg + i;
        if (row >= T) continue;
        float *o = dq + (bh * T + row) * D;
#pragma unroll
        for (int g = 0; g < G; g++)
            *(float4 *)(o + 32 * g + 4 * cg) =
                make_float4(acc[i][4 * g] * scale, acc[i][4 * g + 1] * scale,
                            acc[i][4 * g + 2] * scale, acc[i][4 * g + 3] * scale);
    }
}

/* dk', dv per key tile: loops over query tiles qt >= kt. Rows of the thread's score block are
 * keys, columns are queries: S^T = K Q^T, P^T, dP^T = V dO^T; dv += P^T dO, dk += dS^T Q. */
template <int D>
__global__ void __launch_bounds__(AT_THREADS)
    attn_bwd_dkdv_tiled_kernel(float *dk, float *dv, const float *__restrict__ q,
                               const float *__restrict__ k, const float *__restrict__ v,
                               const float *__restrict__ dout, const float *__restrict__ lse,
                               const float *__restrict__ Dv, int T, int NH, float scale) {
    constexpr int LD = D + 4, G = D / 32;
    extern __shared__ float4 smem4[];
    float *Ks = (float *)smem4, *Vs = Ks + AT * LD, *Qs = Vs + AT * LD, *dOs = Qs + AT * LD;
    float *PTs = dOs + AT * LD, *dSTs = PTs + AT * AT_LDP;
    float *Ls = dSTs + AT * AT_LDP, *Ds = Ls + AT;
    int nT = (T + AT - 1) / AT;
    int kt = (int)blockIdx.x; /* kt = 0 has the most query tiles: first */
    size_t bh = blockIdx.y;
    int h = (int)(bh % NH), bb = (int)(bh / NH);
    int tid = threadIdx.x, rg = tid >> 3, cg = tid & 7;
    const float *qb = q + bh * T * D, *kb = k + bh * T * D, *vb = v + bh * T * D;
    const float *dob = dout + (size_t)bb * T * NH * D + (size_t)h * D;
    load_tile<D>(Ks, kb, D, kt * AT, T);
    load_tile<D>(Vs, vb, D, kt * AT, T);
    float adk[4][D / 8], adv[4][D / 8];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int e = 0; e < D / 8; e++) adk[i][e] = 0.0f, adv[i][e] = 0.0f;
    for (int qt = kt; qt < nT; qt++) {
        __syncthreads();
        load_tile<D>(Qs, qb, D, qt * AT, T);
        load_tile<D>(dOs, dob, (size_t)NH * D, qt * AT, T);
        for (int r = tid; r < AT; r += AT_THREADS) {
            int row = qt * AT + r;
            Ls[r] = row < T ? lse[bh * T + row] : 0.0f;
            Ds[r] = row < T ? Dv[bh * T + row] : 0.0f;
        }
        __syncthreads();
        float st[4][8], dpt[4][8];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 8; j++) st[i][j] = 0.0f, dpt[i][j] = 0.0f;
        tile_dots<D>(st, Ks, Qs, rg, cg);
        tile_dots<D>(dpt, Vs, dOs, rg, cg);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int key = kt * AT + 4 * rg + i;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int r = cg + 8 * j, row = qt * AT + r;
                float p =
                    (key <= row && row < T && key < T) ? expf(st[i][j] * scale - Ls[r]) : 0.0f;
                PTs[(4 * rg + i) * AT_LDP + r] = p;
                dSTs[(4 * rg + i) * AT_LDP + r] = p * (dpt[i][j] - Ds[r]);
            }
        }
        __syncthreads();
        tile_pv<D>(adv, PTs, dOs, rg, cg);
        tile_pv<D>(adk, dSTs, Qs, rg, cg);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int key = kt * AT + 4 * rg + i;
        if (key >= T) continue;
        float *ok = dk + (bh * T + key) * D, *ov = dv + (bh * T + key) * D;
#pragma unroll
        for (int g = 0; g < G; g++) {
            *(float4 *)(ok + 32 * g + 4 * cg) =
                make_float4(adk[i][4 * g] * scale, adk[i][4 * g + 1] * scale,
                            adk[i][4 * g + 2] * scale, adk[i][4 * g + 3] * scale);
            *(float4 *)(ov + 32 * g + 4 * cg) = make_float4(adv[i][4 * g], adv[i][4 * g + 1],
                                                            adv[i][4 * g + 2], adv[i][4 * g + 3]);
        }
    }
}

/* Raise the dynamic shared-memory limit of each tiled kernel once. */
template <int D> static void tiled_setup(void) {
    static int done = 0;
    if (done) return;
    CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_tiled_kernel<D>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fwd_smem_bytes<D>()));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_tiled_kernel<D>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dq_smem_bytes<D>()));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkdv_tiled_kernel<D>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dkdv_smem_bytes<D>()));
    done = 1;
}

template <int D>
static void fwd_tiled(cuda_state *s, float *out, float *lse, const float *q, const float *k,
                      const float *v, int B, int T, int NH, float scale) {
    tiled_setup<D>();
    dim3 grid((T + AT - 1) / AT, B * NH);
    attn_fwd_tiled_kernel<D>
        <<<grid, AT_THREADS, fwd_smem_bytes<D>(), s->stream>>>(out, lse, q, k, v, T, NH, scale);
    CUDA_LAUNCH_CHECK(s);
}

template <int D>
static void bwd_tiled(cuda_state *s, float *dq, float *dk, float *dv, const float *q,
                      const float *k, const float *v, const float *dout, const float *lse,
                      const float *Dv, int B, int T, int NH, float scale) {
    tiled_setup<D>();
    dim3 grid((T + AT - 1) / AT, B * NH);
    attn_bwd_dkdv_tiled_kernel<D><<<grid, AT_THREADS, dkdv_smem_bytes<D>(), s->stream>>>(
        dk, dv, q, k, v, dout, lse, Dv, T, NH, scale);
    CUDA_LAUNCH_CHECK(s);
    attn_bwd_dq_tiled_kernel<D><<<grid, AT_THREADS, dq_smem_bytes<D>(), s->stream>>>(
        dq, q, k, v, dout, lse, Dv, T, NH, scale);
    CUDA_LAUNCH_CHECK(s);
}

/* ---------------------------------------------------------------------------------------- */
/* entry points */

static void check_attention_args(int HS, float rope_theta) {
    if (HS <= 0 || HS > 32 * SIMPLE_MAXJ) {
        FP8T_FATAL("attention head size %d is not supported by the CUDA backend "
                   "(1..%d)",
                   HS, 32 * SIMPLE_MAXJ);
    }
    if (rope_theta > 0.0f && HS % 2 != 0) {
        FP8T_FATAL("RoPE needs an even head size, got %d", HS);
    }
}

static int use_tiled(cuda_state *s, int HS) {
    return s->attn_mode != ATTN_SIMPLE && (HS == 32 || HS == 64 || HS == 128);
}

static unsigned prep_blocks(cuda_state *s, size_t n) {
    size_t want = (n + 255) / 256, cap = (size_t)s->num_sms * 32;
    return (unsigned)(want < cap ? (want ? want : 1) : cap);
}

size_t cuda_attention_saved_bytes(fp8t_backend *b, const fp8t_attn_shape *sh) {
    const cuda_state *s = cuda_of(b);
    const int NKV = fp8t_attn_nkv(sh);
    /* cuDNN keeps q|k|v BF16 token-major [B, T, W] (K/V not expanded per query head) */
    if (NKV > 0 && NKV <= sh->NH && sh->NH % NKV == 0 && cuda_attn_cudnn_usable(b, sh, NKV))
        return cuda_attn_cudnn_saved_bytes(sh, NKV);
    if (s->attn_mode != ATTN_FLASH || !cuda_attn_flash_supported(sh->B, sh->T, sh->NH, sh->HS))
        return 0;
    /* q and the group-expanded k, v: NH heads each */
    return cuda_attn_flash_saved_bytes(sh->B, sh->T, sh->NH, sh->HS);
}

/* NKV (0 = NH) after checking that it divides NH */
static int attention_kv_heads(const fp8t_attn_shape *sh) {
    const int NKV = fp8t_attn_nkv(sh);
    if (NKV <= 0 || NKV > sh->NH || sh->NH % NKV != 0) {
        FP8T_FATAL("attention: %d key/value heads do not divide %d query heads "
                   "(%s:%d)",
                   NKV, sh->NH, __FILE__, __LINE__);
    }
    return NKV;
}

void cuda_attention_forward(fp8t_backend *b, float *out, float *lse, void *saved,
                            const float *qkv, const fp8t_attn_shape *sh) {
    const int B = sh->B, T = sh->T, NH = sh->NH, HS = sh->HS;
    if (B <= 0 || T <= 0 || NH <= 0) return;
    check_attention_args(HS, sh->rope_theta);
    const int NKV = attention_kv_heads(sh);
    cuda_state *s = cuda_of(b);
    const float *cosv, *sinv;
    rope_tables(b, sh, &cosv, &sinv);
    float scale = 1.0f / sqrtf((float)HS);
    /* cuDNN's fused attention first where it is asked for and takes the shape; it and flash
     * read qkv themselves */
    if (cuda_attn_cudnn_fwd(b, out, lse, saved, qkv, cosv, sinv, sh, NKV, scale) == 0) {
        s->n_attn_tc++, s->n_attn_cudnn++;
        return;
    }
    if (s->attn_mode == ATTN_FLASH &&
        cuda_attn_flash_fwd(b, out, lse, (uint16_t *)saved, qkv, sh->qkv_bias, cosv, sinv, B, T,
                            NH, NKV, HS, scale) == 0) {
        s->n_attn_tc++;
        return;
    }
    if (sh->qkv_bias) { /* the FP32 and GEMM paths read qkv with its bias already added */
        const size_t n = (size_t)B * T * fp8t_attn_qkv_width(sh);
        float *y = (float *)cuda_scratch(b, SCR_QKV, n * sizeof(float));
        CUDA_CHECK(
            cudaMemcpyAsync(y, qkv, n * sizeof(float), cudaMemcpyDeviceToDevice, s->stream));
        cuda_bias_add(b, y, sh->qkv_bias, B * T, fp8t_attn_qkv_width(sh));
        qkv = y;
    }
    size_t per = (size_t)B * NH * T * HS;
    float *q = (float *)cuda_scratch(b, SCR_ATTN, 3 * per * sizeof(float));
    float *k = q + per, *v = k + per;
    size_t pairs = (size_t)B * T * NH * ((HS + 1) / 2);
    attn_prep_kernel<<<prep_blocks(s, pairs), 256, 0, s->stream>>>(q, k, v, qkv, cosv, sinv, B, T,
                                                                   NH, NKV, HS);
    CUDA_LAUNCH_CHECK(s);
    if (s->attn_mode == ATTN_GEMM &&
        cuda_attn_gemm_fwd(b, out, lse, q, k, v, B, T, NH, HS, scale) == 0) {
        s->n_attn_tc++;
        return;
    }
    s->n_attn_fp32++;
    if (use_tiled(s, HS)) {
        if (HS == 32)
            fwd_tiled<32>(s, out, lse, q, k, v, B, T, NH, scale);
        else if (HS == 64)
            fwd_tiled<64>(s, out, lse, q, k, v, B, T, NH, scale);
        else
            fwd_tiled<128>(s, out, lse, q, k, v, B, T, NH, scale);
    } else {
        size_t threads = (size_t)B * NH * T * 32;
        attn_fwd_simple_kernel<<<cdiv_u(threads, 256), 256, 0, s->stream>>>(out, lse, q, k, v, B,
                                                                            T, NH, HS, scale);
        CUDA_LAUNCH_CHECK(s);
    }
}

void cuda_attention_backward(fp8t_backend *b, float *dqkv, const float *dout, const float *qkv,
                             const void *saved, const float *out, const float *lse,
                             const fp8t_attn_shape *sh) {
    if (sh->qkv_bias) FP8T_FATAL("attention_backward: qkv_bias is for the forward ops only");
    const int B = sh->B, T = sh->T, NH = sh->NH, HS = sh->HS;
    if (B <= 0 || T <= 0 || NH <= 0) return;
    check_attention_args(HS, sh->rope_theta);
    const int NKV = attention_kv_heads(sh);
    cuda_state *s = cuda_of(b);
    size_t per = (size_t)B * NH * T * HS;
    size_t rows = (size_t)B * NH * T;
    const float *cosv, *sinv;
    rope_tables(b, sh, &cosv, &sinv);
    if (cuda_attn_cudnn_bwd(b, dqkv, dout, qkv, saved, out, lse, cosv, sinv, sh, NKV,
                            1.0f / sqrtf((float)HS)) == 0) {
        s->n_attn_tc++, s->n_attn_cudnn++;
        return;
    }
    /* scratch: per-head dq, dk, dv (not needed by flash writing dqkv itself), q, k, v (the prep
     * kernel's, not needed by flash), then Dv */
    const int flash = s->attn_mode == ATTN_FLASH && cuda_attn_flash_supported(B, T, NH, HS);
    /* flash writes dqkv itself when there is nothing to undo (RoPE) or sum (GQA) */
    const int flash_direct = flash && !cosv && NKV == NH;
    const size_t nbuf = flash ? (flash_direct ? 0 : 3) : 6;
    float *base = (float *)cuda_scratch(b, SCR_ATTN, (nbuf * per + rows) * sizeof(float));
    float *dq = NULL, *dk = NULL, *dv = NULL, *q = NULL, *k = NULL, *v = NULL;
    if (nbuf >= 3) dq = base, dk = dq + per, dv = dk + per;
    if (nbuf == 6) q = dv + per, k = q + per, v = k + per;
    float *Dv = base + nbuf * per;
    size_t pairs = (size_t)B * T * NH * ((HS + 1) / 2);
    size_t post_pairs = (size_t)B * T * (NH + NKV) * ((HS + 1) / 2);
    float scale = 1.0f / sqrtf((float)HS);
    /* flash reads qkv itself and takes Dv from its pass over dout */
    if (flash) {
        cuda_attn_flash_bwd(b, flash_direct ? dqkv : NULL, dq, dk, dv, qkv,
                            (const uint16_t *)saved, cosv, sinv, dout, out, lse, Dv, B, T, NH,
                            NKV, HS, scale);
        s->n_attn_tc++;
        if (!flash_direct) {
            attn_post_kernel<<<prep_blocks(s, post_pairs), 256, 0, s->stream>>>(
                dqkv, dq, dk, dv, cosv, sinv, B, T, NH, NKV, HS);
            CUDA_LAUNCH_CHECK(s);
        }
        return;
    }
    attn_rowdot_kernel<<<cdiv_u(rows * 32, 256), 256, 0, s->stream>>>(Dv, dout, out, B, T, NH,
                                                                      HS);
    CUDA_LAUNCH_CHECK(s);
    attn_prep_kernel<<<prep_blocks(s, pairs), 256, 0, s->stream>>>(q, k, v, qkv, cosv, sinv, B, T,
                                                                   NH, NKV, HS);
    CUDA_LAUNCH_CHECK(s);
    int done = 0;
    if (s->attn_mode == ATTN_GEMM)
        done =
            cuda_attn_gemm_bwd(b, dq, dk, dv, q, k, v, dout, lse, Dv, B, T, NH, HS, scale) == 0;
    if (done)
        s->n_attn_tc++;
    else
        s->n_attn_fp32++;
    if (done) {
        /* the tensor-core core wrote dq, dk, dv; the scatter below is shared */
    } else if (use_tiled(s, HS)) {
        if (HS == 32)
            bwd_tiled<32>(s, dq, dk, dv, q, k, v, dout, lse, Dv, B, T, NH, scale);
        else if (HS == 64)
            bwd_tiled<64>(s, dq, dk, dv, q, k, v, dout, lse, Dv, B, T, NH, scale);
        else
            bwd_tiled<128>(s, dq, dk, dv, q, k, v, dout, lse, Dv, B, T, NH, scale);
    } else {
        size_t threads = rows * 32;
        attn_bwd_dq_simple_kernel<<<cdiv_u(threads, 256), 256, 0, s->stream>>>(
            dq, q, k, v, dout, lse, Dv, B, T, NH, HS, scale);
        CUDA_LAUNCH_CHECK(s);
        attn_bwd_dkdv_simple_kernel<<<cdiv_u(threads, 256), 256, 0, s->stream>>>(
            dk, dv, q, k, v, dout, lse, Dv, B, T, NH, HS, scale);
        CUDA_LAUNCH_CHECK(s);
    }
    attn_post_kernel<<<prep_blocks(s, post_pairs), 256, 0, s->stream>>>(dqkv, dq, dk, dv, cosv,
                                                                        sinv, B, T, NH, NKV, HS);
    CUDA_LAUNCH_CHECK(s);
}

/* How many attention calls (forward and backward) ran on a tensor-core core (flash, gemm) and
 * how many on the FP32 kernels; tests use it to see that a requested fast path really ran.
 * 0 ok, -1 if b is not a CUDA backend. */
extern "C" int fp8t_cuda_attention_counts(fp8t_backend *b, long *tensor_core, long *fp32) {
    if (!b || !b->name || strcmp(b->name, "cuda") != 0) return -1;
    cuda_state *s = cuda_of(b);
    if (tensor_core) *tensor_core = s->n_attn_tc;
    if (fp32) *fp32 = s->n_attn_fp32;
    return 0;
}

/* How many of the tensor-core calls went through cuDNN's fused attention (0 ok, -1 if b is not
 * a CUDA backend): the test that asks for cuDNN sees that it did not silently fall back. */
extern "C" int fp8t_cuda_attention_cudnn_calls(fp8t_backend *b, long *calls) {
    if (!b || !b->name || strcmp(b->name, "cuda") != 0) return -1;
    if (calls) *calls = cuda_of(b)->n_attn_cudnn;
    return 0;
}
